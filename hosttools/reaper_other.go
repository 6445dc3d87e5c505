//go:build !linux

package hosttools

import "os/exec"

// terminalCommand starts bash in its own process group; without Linux's
// child subreaper, a process that leaves the group can outlive the call.
func terminalCommand(command string) *exec.Cmd { return exec.Command("bash", "-c", command) }
