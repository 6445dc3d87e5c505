package engine

import "path/filepath"

// SealJournal seals body (a journal's JSON) as the engines on journal dir
// dir do, for tests that write a journal of an engine that died.
func SealJournal(dir string, body []byte) ([]byte, error) {
	key, err := stateKey(filepath.Join(dir, journalKeyFile), "journal key")
	if err != nil {
		return nil, err
	}
	return seal(key, journalKind, rawJSON(body))
}

type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }
