package kubernetes

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// podName is "sandboxd-SESSION-RANDOM", a DNS label: the session's name
// lowercased, what a name may not hold turned into dashes, cut to 40.
func podName(session string) string {
	var b [4]byte
	rand.Read(b[:])
	s := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(session), "-"), "-")
	if len(s) > 40 {
		s = strings.TrimRight(s[:40], "-")
	}
	if s == "" {
		return "sandboxd-" + hex.EncodeToString(b[:])
	}
	return "sandboxd-" + s + "-" + hex.EncodeToString(b[:])
}

// hashPrefix starts a label value that stands for a value a label may not
// hold (too long, or with characters such as "/"): its SHA-256.
const hashPrefix = "sha256-"

// labelValue is v when a label may hold it, else hashPrefix and 40 hex
// digits of its SHA-256. The annotation of the same key keeps v itself.
func labelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 && !strings.HasPrefix(v, hashPrefix) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return hashPrefix + hex.EncodeToString(sum[:20])
}

// encodeLabels turns labels into pod labels (labelValue of each value).
func encodeLabels(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = labelValue(v)
	}
	return out
}

// selector selects the pods labelled with every label of m.
func selector(m map[string]string) labels.Selector {
	return labels.SelectorFromSet(encodeLabels(m))
}

// matches reports whether annotations hold every label of want exactly (a
// hashed label value matches the value it stands for and no other).
func matches(annotations, want map[string]string) bool {
	for k, v := range want {
		if got, ok := annotations[k]; !ok || got != v {
			return false
		}
	}
	return true
}
