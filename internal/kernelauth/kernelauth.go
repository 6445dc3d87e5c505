// Package kernelauth is how the engine and a runner tell each other's
// messages from anyone else's: an HMAC-SHA256 under the kernel's secret,
// which only the two hold (the engine in memory, the runner in memory, the
// secret having reached it on its stdin). Every door of a runner (its
// socket, its request and answer files, its wake FIFO) carries one.
// engine/runner/runner.py computes the same MACs.
package kernelauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Kind says what a MAC vouches for, so one message can never pass for
// another.
type Kind string

// The kinds of message.
const (
	Request   Kind = "req"    // a cell request file, engine to runner
	Result    Kind = "res"    // a cell result file, runner to engine
	Answer    Kind = "ans"    // a tool-call answer file (seq, body), engine to runner
	RPC       Kind = "rpc"    // a tool-call request (seq, cell, tool, args), kernel to engine
	Interrupt Kind = "int"    // an interrupt rung on the wake FIFO (cell id)
	Config    Kind = "cfg"    // a new idle_exit rung on the wake FIFO (seconds)
	Engine    Kind = "engine" // the engine's answer to a runner's socket challenge
	Runner    Kind = "runner" // the runner's answer to the engine's challenge
)

// SecretLen is the length of a kernel secret, in bytes.
const SecretLen = 32

// NewSecret returns a fresh random secret, hex-encoded.
func NewSecret() string {
	b := make([]byte, SecretLen)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// NewNonce returns a fresh random challenge, hex-encoded.
func NewNonce() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// MAC is the hex HMAC-SHA256 under the hex secret of kind and parts. Each
// part is length-prefixed, so no two lists of parts share an encoding.
func MAC(secret string, kind Kind, parts ...string) string {
	key, err := hex.DecodeString(secret)
	if err != nil || len(key) == 0 {
		return "" // never equal to a real MAC: Valid refuses ""
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(kind))
	m.Write([]byte{0})
	for _, p := range parts {
		m.Write([]byte(strconv.Itoa(len(p))))
		m.Write([]byte{':'})
		m.Write([]byte(p))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// Valid reports, in constant time, whether mac is the MAC of kind and parts
// under secret. An empty secret or mac is never valid.
func Valid(secret, mac string, kind Kind, parts ...string) bool {
	want := MAC(secret, kind, parts...)
	return want != "" && mac != "" && hmac.Equal([]byte(mac), []byte(want))
}
