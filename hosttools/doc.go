// Package hosttools is the host side of kernel tool calls: a registry of
// named tools with argument schemas, and the built-in tools an operator
// lets kernel code call (read_file, write_file, list_files, terminal,
// http_get), confined to a workspace directory and an HTTP allow-list.
//
// The package knows nothing about the RPC channel. The engine parses and
// authenticates a request, checks the kernel's tool set and call budget,
// and then hands a Call to Registry.Dispatch, which drops background-style
// parameters for terminal-like tools, validates the arguments against the
// tool's schema and runs the handler. Results larger than the engine's
// limit go through Storage, which keeps the full text in an owner-only tree
// and returns a preview plus the path.
package hosttools
