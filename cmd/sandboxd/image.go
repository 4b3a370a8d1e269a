package main

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/images"
	"github.com/sandboxd/sandboxd/images/engine"
)

var cmdImageBuild = &command{
	name:    "image build",
	args:    "[--rebuild] [--cache DIR] [--config FILE] [NAME...]",
	summary: "build sandboxd's sandbox images (minimal, dev, and those the configuration declares; default: all) into the engine, with progress: no registry, packages from the Debian mirror or the cache; an unchanged image is left as it is",
	setup: func(fs *flag.FlagSet) runFunc {
		rebuild := fs.Bool("rebuild", false, "build anew even an unchanged image, making its root filesystem anew")
		cache := fs.String("cache", "", "the `dir`ectory of cached root filesystems (default: sandboxd/images under the user's cache directory)")
		config := fs.String("config", "", "the daemon's configuration `file`, whose \"images\" declares more images")
		return func(ctx context.Context, sio stdio, args []string) error {
			if _, err := loadServeConfig(*config); err != nil {
				return err
			}
			names := args
			if len(names) == 0 {
				defs, err := images.Definitions()
				if err != nil {
					return err
				}
				for _, d := range defs {
					names = append(names, d.Name)
				}
			}
			for _, n := range names {
				if _, err := images.Lookup(n); err != nil {
					return usagef("%v", err)
				}
			}
			cli, err := dockerClient(ctx)
			if err != nil {
				return fmt.Errorf("docker: %w (run 'sandboxd doctor')", err)
			}
			defer cli.Close()
			for _, n := range names {
				opts := []engine.Option{engine.WithProgress(progressPrinter(sio, "image "+n))}
				if *rebuild {
					opts = append(opts, engine.WithRebuild())
				}
				if *cache != "" {
					opts = append(opts, engine.WithCacheDir(*cache))
				}
				ref, err := engine.Build(ctx, cli, n, opts...)
				if err != nil {
					return fmt.Errorf("image %s: %w", n, err)
				}
				fmt.Fprintln(sio.out, ref)
			}
			return nil
		}
	},
}

// buildCost says what building an image of sandboxd's costs on a cold
// machine (BENCHMARKS.md, image builds).
func buildCost(image string) string {
	d, err := images.Lookup(image)
	switch {
	case err != nil:
		return "an image sandboxd does not define"
	case d.Builder == "busybox":
		return "a few seconds"
	}
	return "the first build of " + d.Name + " takes several minutes, mostly Debian packages downloaded and unpacked; later builds reuse the cached root filesystem"
}

// progressPrinter returns a progress function for a long operation: each
// line goes to standard error with the time since the operation began and
// what it is about ("[  4.2s] image dev: debootstrap: …"). It is safe for
// concurrent use.
func progressPrinter(sio stdio, what string) func(line string) {
	start := time.Now()
	var mu sync.Mutex
	return func(line string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(sio.err, "[%6.1fs] %s: %s\n", time.Since(start).Seconds(), what, line)
	}
}
