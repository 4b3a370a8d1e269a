package docker

// PruneAgentVolumes is pruneAgentVolumes, for the tests of package
// docker_test.
var PruneAgentVolumes = pruneAgentVolumes
