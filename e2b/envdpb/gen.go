// Package envdpb holds the Go types and Connect handlers of E2B's envd
// services, Process and Filesystem, generated from the .proto files here
// by protoc (Debian's protobuf-compiler), protoc-gen-go and
// protoc-gen-connect-go:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
//	go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
//	go generate ./e2b/envdpb
package envdpb

//go:generate protoc --go_out=. --go_opt=module=github.com/sandboxd/sandboxd/e2b/envdpb --connect-go_out=. --connect-go_opt=module=github.com/sandboxd/sandboxd/e2b/envdpb process.proto filesystem.proto
