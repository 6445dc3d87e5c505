//go:build unix

package backends

import "syscall"

// openPrivateFlags make opening a state file fail on a planted symlink
// (O_NOFOLLOW) and never block on a planted FIFO (O_NONBLOCK); the mode
// check after opening refuses anything that is not a regular file.
const openPrivateFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK
