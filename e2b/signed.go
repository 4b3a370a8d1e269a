package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A signed /files URL lets a client without the access token read or write
// one file of a secure sandbox (the SDK's download_url and upload_url): its
// signature is v1_ and the unpadded base64 of the SHA-256 of
// "PATH:OPERATION:USER:TOKEN" (":EXPIRATION" added when it expires), the
// operation "read" for GET and "write" for POST, the expiration a Unix time.
// Such a URL carries no header, so it names its sandbox by its signature
// alone: the server finds the secure sandbox whose token signs it.

// isSigned reports whether r is a /files request with a signature.
func isSigned(r *http.Request) bool {
	return r.URL.Path == "/files" && r.URL.Query().Get("signature") != ""
}

// signature is the v1 signature of a /files request.
func signature(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedBy reports whether token signs r.
func signedBy(r *http.Request, token string) bool {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	want := signature(q.Get("path"), op, q.Get("username"), token, q.Get("signature_expiration"))
	return subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) == 1
}

// bySignature is the ID of the running secure sandbox whose token signs r,
// or "".
func (s *Server) bySignature(r *http.Request) string {
	s.mu.Lock()
	boxes := make([]*sandbox, 0, len(s.tokens))
	for _, id := range s.tokens {
		boxes = append(boxes, s.boxes[id])
	}
	s.mu.Unlock()
	for _, b := range boxes {
		if b != nil && signedBy(r, b.token) {
			return b.sess.ID()
		}
	}
	return ""
}

// checkSigned judges a signed request to b: "" when its signature is b's
// and has not expired, else why not, as envd words it.
func checkSigned(r *http.Request, b *sandbox) string {
	if !signedBy(r, b.token) {
		return "invalid signature"
	}
	if exp := r.URL.Query().Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(exp), 10, 64)
		if err != nil {
			return "invalid signature expiration"
		}
		if time.Now().Unix() > n {
			return "signature is already expired"
		}
	}
	return ""
}
