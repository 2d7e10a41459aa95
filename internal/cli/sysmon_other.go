//go:build !linux

package cli

// reexec does nothing off Linux: the process keeps Go's default sysmon.
func reexec(args, env []string) {}
