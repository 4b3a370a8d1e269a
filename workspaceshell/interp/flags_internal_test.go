package interp

import (
	"slices"
	"strings"
	"testing"
)

// TestFlagSetters: a flagSpec's setters are keyed by the canonical names
// of the options it spells, so a setter is never left unreachable by a
// misspelt key.
func TestFlagSetters(t *testing.T) {
	for name, unreachable := range map[string][]string{
		"pwd": setterKeysUnspelt(&pwdFlags), "ls": setterKeysUnspelt(&lsFlags), "cat": setterKeysUnspelt(&catFlags),
		"head/tail": setterKeysUnspelt(&headTailFlags), "wc": setterKeysUnspelt(&wcFlags),
		"grep": setterKeysUnspelt(&grepFlags), "rg": setterKeysUnspelt(&rgFlags), "curl": setterKeysUnspelt(&curlFlags),
		"mkdir": setterKeysUnspelt(&mkdirFlags), "touch": setterKeysUnspelt(&touchFlags), "cp": setterKeysUnspelt(&cpFlags),
		"mv": setterKeysUnspelt(&mvFlags), "rm": setterKeysUnspelt(&rmFlags),
	} {
		if len(unreachable) > 0 {
			t.Errorf("%s: setters for options it does not spell: %q", name, unreachable)
		}
	}
}

// setterKeysUnspelt are the keys of f.set that no option of f is called.
func setterKeysUnspelt[O any](f *flagSpec[O]) []string {
	spelt := map[string]bool{}
	for _, ch := range f.bools + f.values {
		spelt[string(ch)] = true
	}
	for _, canon := range f.long {
		spelt[strings.TrimRight(canon, "=?")] = true
	}
	var out []string
	for k := range f.set {
		if !spelt[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
