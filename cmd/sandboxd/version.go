package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3"); otherwise
// it is the module version Go recorded in the binary, or "devel".
var version = ""

func sandboxdVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

var cmdVersion = &command{
	name:    "version",
	args:    "",
	summary: "print sandboxd's version",
	setup: func(*flag.FlagSet) runFunc {
		return func(_ context.Context, sio stdio, args []string) error {
			if len(args) > 0 {
				return usagef("version takes no arguments")
			}
			printVersion(sio.out)
			return nil
		}
	},
}

// printVersion writes sandboxd's version, the Go release that built it and
// the platform.
func printVersion(w io.Writer) {
	fmt.Fprintf(w, "sandboxd %s %s %s/%s\n", sandboxdVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
