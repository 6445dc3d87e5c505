//go:build unix

package backends

import "syscall"

// syscallNoFollow makes opening a state file through a planted symlink fail.
const syscallNoFollow = syscall.O_NOFOLLOW
