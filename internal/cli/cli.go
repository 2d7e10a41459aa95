// Package cli holds what the commands share: flags from the environment,
// logger setup and address parsing.
package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
)

// EnvName is the variable that sets flag name: SWITCHYARD_ and the name in
// upper case with '-' as '_' (--nats-url is SWITCHYARD_NATS_URL).
func EnvName(name string) string {
	return "SWITCHYARD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// ApplyEnv sets every flag not given on the command line from its
// environment variable, if that is set. Command-line flags win.
func ApplyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v := getenv(EnvName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, e)
			}
		}
	})
	return err
}

// Logger returns a slog logger writing to w in format "text" or "json" at
// level "debug", "info", "warn" or "error".
func Logger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

// HostPort splits "host:port" for nats-server options; port 0 means a
// random port, which nats-server spells -1.
func HostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("address %q: bad port", addr)
	}
	if port == 0 {
		port = -1
	}
	return host, port, nil
}

// Section is a group of flags in a command's help.
type Section struct {
	Title string
	Flags []string
}

// SetUsage makes fs print a grouped help: a synopsis, then each section's
// flags with their defaults and environment variables, then any flag no
// section names under "Other".
func SetUsage(fs *flag.FlagSet, synopsis string, sections []Section) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n", strings.TrimSpace(synopsis))
		listed := map[string]bool{}
		print := func(title string, names []string) {
			fmt.Fprintf(w, "\n%s:\n", title)
			for _, name := range names {
				f := fs.Lookup(name)
				if f == nil {
					continue
				}
				listed[name] = true
				typ, usage := flag.UnquoteUsage(f)
				line := "  --" + f.Name
				if typ != "" {
					line += " " + typ
				}
				fmt.Fprintf(w, "%s\n      %s", line, usage)
				if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
					fmt.Fprintf(w, " (default %s)", f.DefValue)
				}
				fmt.Fprintf(w, " [$%s]\n", EnvName(f.Name))
			}
		}
		for _, s := range sections {
			print(s.Title, s.Flags)
		}
		var rest []string
		fs.VisitAll(func(f *flag.Flag) {
			if !listed[f.Name] {
				rest = append(rest, f.Name)
			}
		})
		if len(rest) > 0 {
			print("Other", rest)
		}
		fmt.Fprintf(w, "\nEvery flag can also be set from the environment variable shown in brackets;\na flag on the command line wins.\n")
	}
}
