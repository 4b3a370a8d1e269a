package delivery

// SetPlacingHook makes Apply call f with each temporary file's name before
// it is renamed into place, until the returned function is called.
func SetPlacingHook(f func(tmp string)) (restore func()) {
	testHookPlacing = f
	return func() { testHookPlacing = nil }
}
