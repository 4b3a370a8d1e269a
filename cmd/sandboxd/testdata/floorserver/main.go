// Command floorserver is the floor `sandboxd bench --floor-server` holds
// sandboxd's small calls to (issue 31): about the least an HTTP server in a
// session's image can do for a read, a stat, a listing and a command. It
// serves, on loopback, the files under -root:
//
//	GET  /file?path=P  P's contents, as they are
//	GET  /stat?path=P  P's lstat: {"name","size","mode","modTime","dir"}
//	GET  /ls?path=P    P's entries: {"entries":["a","b/",…]}
//	POST /exec         forks and execs `bash -c true`: {"exitCode":N}
//	GET  /healthz      200 once it serves
//
// It confines nothing, journals nothing and checks nothing: it is the floor,
// not a server to offer anyone. bench builds it with CGO_ENABLED=0 and
// mounts it into a container of the session's image.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "the `address` to listen on")
	root := flag.String("root", "/workspace", "the `directory` served")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	name := func(r *http.Request) string {
		return filepath.Join(*root, filepath.Clean("/"+r.URL.Query().Get("path")))
	}
	fail := func(w http.ResponseWriter, err error) {
		code := http.StatusInternalServerError
		if errors.Is(err, os.ErrNotExist) {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
	}
	answer := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	http.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) {})
	http.HandleFunc("GET /file", func(w http.ResponseWriter, r *http.Request) {
		data, err := os.ReadFile(name(r))
		if err != nil {
			fail(w, err)
			return
		}
		w.Write(data)
	})
	http.HandleFunc("GET /stat", func(w http.ResponseWriter, r *http.Request) {
		fi, err := os.Lstat(name(r))
		if err != nil {
			fail(w, err)
			return
		}
		answer(w, map[string]any{"name": fi.Name(), "size": fi.Size(), "mode": fi.Mode().String(),
			"modTime": fi.ModTime().Format(time.RFC3339Nano), "dir": fi.IsDir()})
	})
	http.HandleFunc("GET /ls", func(w http.ResponseWriter, r *http.Request) {
		es, err := os.ReadDir(name(r))
		if err != nil {
			fail(w, err)
			return
		}
		names := make([]string, len(es))
		for i, e := range es {
			names[i] = e.Name()
			if e.IsDir() {
				names[i] += "/"
			}
		}
		answer(w, map[string]any{"entries": names})
	})
	http.HandleFunc("POST /exec", func(w http.ResponseWriter, r *http.Request) {
		cmd := exec.Command("bash", "-c", "true")
		cmd.Dir = *root
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			fail(w, err)
			return
		}
		answer(w, map[string]any{"exitCode": cmd.ProcessState.ExitCode()})
	})
	fmt.Println("floorserver: serving", *root, "on", ln.Addr())
	log.Fatal(http.Serve(ln, nil))
}
