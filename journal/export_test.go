package journal

import "github.com/sandboxd/sandboxd/workspace"

// Recorder is the FileSystem Record gives its function, for the kit's
// wrapper case (conformance.TestWrapper).
func (j *Journal) Recorder() workspace.FileSystem { return j.newRecorder().fs() }
