//go:build !linux

package hosttools

import "os/exec"

// awaitExit waits for cmd and reaps it at once: without Linux's
// waitid(WNOWAIT) there is no portable way to wait without reaping, so the
// caller's later group kill has a small window in which the group id could
// in principle be reused.
func awaitExit(cmd *exec.Cmd) func() error {
	err := cmd.Wait()
	return func() error { return err }
}
