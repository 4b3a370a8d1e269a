module github.com/sandboxd/sandboxd

go 1.25

require github.com/bmatcuk/doublestar/v4 v4.10.4 // indirect
