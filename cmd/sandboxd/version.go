package main

import (
	"context"
	"flag"
	"fmt"
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
			_, err := fmt.Fprintf(sio.out, "sandboxd %s %s %s/%s\n", sandboxdVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		}
	},
}
