package docker

// PruneAgentVolumes is pruneAgentVolumes, for the tests of package
// docker_test.
var PruneAgentVolumes = pruneAgentVolumes

// RemoveVolume is removeVolume, for the tests of package docker_test.
var RemoveVolume = removeVolume

// LoopsOf is loopsOf, for the tests of package docker_test.
var LoopsOf = loopsOf
