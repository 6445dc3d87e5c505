package engine

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Nothing in the state dir is believed without proof: what the engine
// writes there for a later engine to act on (its journal, whose records
// say which processes to kill and which dirs to remove; a kept runner,
// code every later kernel runs) is sealed with a MAC under a key of the
// state dir's own, which no kernel can see, so a file planted or changed
// by anyone else of the login is refused.

// ErrUnsealed: a file does not carry a valid MAC under the engine's key.
var ErrUnsealed = errors.New("not sealed by an engine of this state dir")

// sealedFile is what a sealed file holds: the JSON body and its MAC.
type sealedFile struct {
	Body json.RawMessage `json:"body"`
	MAC  string          `json:"mac"`
}

// sealMAC is the MAC of body as a file of kind (a journal is no runner
// file, however alike their bytes).
func sealMAC(key []byte, kind string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(kind))
	m.Write([]byte{0})
	m.Write(body)
	return m.Sum(nil)
}

// seal returns v as a sealed file of kind.
func seal(key []byte, kind string, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sealedFile{Body: body, MAC: hex.EncodeToString(sealMAC(key, kind, body))})
}

// unseal decodes a sealed file of kind into v (unknown fields are errors),
// once its MAC holds; else it returns an error wrapping ErrUnsealed.
func unseal(key []byte, kind string, data []byte, v any) error {
	var f sealedFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return fmt.Errorf("%w (%v)", ErrUnsealed, err)
	}
	mac, err := hex.DecodeString(f.MAC)
	if err != nil || !hmac.Equal(mac, sealMAC(key, kind, f.Body)) {
		return fmt.Errorf("%w: its MAC does not hold", ErrUnsealed)
	}
	dec = json.NewDecoder(bytes.NewReader(f.Body))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// stateKey reads the 32-byte key at path (what says what it is for, in
// errors), making it if there is none: a regular file of this user, mode
// 0600, or an error saying what to do.
func stateKey(path, what string) ([]byte, error) {
	key, err := readStateKey(path, what)
	if !errors.Is(err, os.ErrNotExist) {
		return key, err
	}
	if err := EnsurePrivateDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	key = make([]byte, 32)
	rand.Read(key)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, os.ErrExist) {
		time.Sleep(50 * time.Millisecond) // another engine on this dir is writing it
		return readStateKey(path, what)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	_, werr := f.Write(key)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return nil, fmt.Errorf("%s %s: %w", what, path, werr)
	}
	return key, nil
}

func readStateKey(path, what string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) || st.Size() != 32 {
		return nil, fmt.Errorf("%s %s must be a 32-byte file owned by you with mode 0600 (found %v, %d bytes); remove it and what it sealed",
			what, path, st.Mode(), st.Size())
	}
	key := make([]byte, 32)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return key, nil
}
