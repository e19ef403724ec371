package transport

import (
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

func TestProcessExited(t *testing.T) {
	if ProcessExited(nil) {
		t.Fatal("no pidfd reports exited")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a child process (sleep): %v", err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Skipf("this kernel has no pidfd_open: %v", err)
	}
	pidfd := os.NewFile(uintptr(fd), "pidfd")
	defer pidfd.Close()
	if ProcessExited(pidfd) {
		t.Fatal("a running process reports exited")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if !ProcessExited(pidfd) {
		t.Fatal("a killed process does not report exited")
	}
}
