package dockerexec

// PruneAgentVolumes is pruneAgentVolumes, for the tests of package
// dockerexec_test.
var PruneAgentVolumes = pruneAgentVolumes
