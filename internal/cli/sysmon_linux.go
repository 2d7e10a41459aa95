package cli

import "syscall"

// reexec replaces the process image with the running binary's own
// (/proc/self/exe, which works even if the file was replaced or removed
// since it started): same PID, open files and arguments, new
// environment. It returns only if the exec fails.
func reexec(args, env []string) {
	_ = syscall.Exec("/proc/self/exe", args, env)
}
