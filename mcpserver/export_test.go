package mcpserver

// EncodeResponse is encodeResponse, for the tests.
var EncodeResponse = encodeResponse
