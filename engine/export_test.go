package engine

import "path/filepath"

// SealJournal seals body (a journal's JSON) as the engines on journal dir
// dir do, for tests that write a journal of an engine that died.
func SealJournal(dir string, body []byte) ([]byte, error) {
	return sealWith(filepath.Join(dir, journalKeyFile), journalKind, body)
}

// SealKeptRunner seals body (a kept runner's JSON) as the engines on state
// dir stateDir do, and UnsealKeptRunner opens one, for tests that change
// a kept runner.
func SealKeptRunner(stateDir string, body []byte) ([]byte, error) {
	return sealWith(filepath.Join(stateDir, "runners", runnerKeyFile), runnerKind, body)
}

func UnsealKeptRunner(stateDir string, data []byte) ([]byte, error) {
	key, err := stateKey(filepath.Join(stateDir, "runners", runnerKeyFile), "runner key")
	if err != nil {
		return nil, err
	}
	var body rawJSON
	err = unseal(key, runnerKind, data, &body)
	return body, err
}

func sealWith(keyFile, kind string, body []byte) ([]byte, error) {
	key, err := stateKey(keyFile, kind+" key")
	if err != nil {
		return nil, err
	}
	return seal(key, kind, rawJSON(body))
}

type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = append((*r)[:0], b...)
	return nil
}
