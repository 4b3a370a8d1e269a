// Package adversarial is sandboxd's adversarial suite: tests that attack the
// local and Docker backends, the tool layer and the daemon the way an
// agent's commands, a hostile repository, another tenant or a network caller
// would, and assert both the safe outcome and that nothing was lost or
// written where it must not be. SECURITY.md maps each attack to its test.
//
//	go test ./adversarial/                 # the suite (Docker required when CI is set)
//	go test ./adversarial/ -run XXX -fuzz FuzzUpload -fuzztime 2m
//
// The package has no API; it holds only tests and this documentation.
package adversarial
