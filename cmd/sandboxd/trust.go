package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/sessionca"
)

// hostCADirs are where a host keeps the certificate authorities its
// administrator added to the system's: Debian's and Ubuntu's
// (update-ca-certificates), Fedora's and RHEL's (update-ca-trust).
var hostCADirs = []string{"/usr/local/share/ca-certificates", "/etc/pki/ca-trust/source/anchors"}

// hostAddedCAs lists the certificate files under hostCADirs, sorted: what
// the host trusts beyond its distribution's bundle, which the images'
// bundles hold too.
func hostAddedCAs() []string {
	var files []string
	for _, dir := range hostCADirs {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".crt") || strings.HasSuffix(p, ".pem") || strings.HasPrefix(dir, "/etc/pki")) {
				files = append(files, p)
			}
			return nil
		})
	}
	slices.Sort(files)
	return files
}

// sessionCAs are the authorities sessions trust besides their own, as the
// configuration's caCerts names them (nil: the host's added ones): their
// files, and their certificates as PEM.
func sessionCAs(configured []string) ([]string, []byte, error) {
	files := configured
	if files == nil {
		files = hostAddedCAs()
	}
	var all bytes.Buffer
	for _, f := range files {
		certs, err := readCerts(f)
		if err != nil {
			return nil, nil, fmt.Errorf("caCerts: %w", err)
		}
		for _, c := range certs {
			pem.Encode(&all, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
	}
	return files, all.Bytes(), nil
}

// readCerts reads a file of PEM certificates, and nothing else.
func readCerts(file string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	certs, err := sessionca.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return certs, nil
}
