// Package pyecho is the far end of the echo floors: a Python process that
// does next to nothing per line, to set beside a kerneldeck runner.
package pyecho

// Script, run as `python3 -c Script SOCKET`, binds a Unix socket at
// SOCKET, prints "ready" once it listens, accepts one connection and
// answers every line it reads there with the same line.
const Script = `import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
for line in c.makefile("rb"):
    c.sendall(line)
`
