// Package imagefile writes a cell's images (its displays' image parts) to
// new private files, for the dashboard's s and o and the REPL.
package imagefile

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kerneldeck/kerneldeck/engine"
)

// Save writes each display's first image type to a new 0600 file in dir,
// named base-N.EXT (never over an existing file), and returns the paths;
// displays without an image have none.
func Save(dir string, displays []engine.Display, base string) ([]string, error) {
	var saved []string
	for i, d := range displays {
		path, err := SaveOne(dir, d, fmt.Sprintf("%s-%d", base, i+1))
		if err != nil {
			return saved, err
		}
		if path != "" {
			saved = append(saved, path)
		}
	}
	return saved, nil
}

// SaveOne writes display d's first image type to a new 0600 file in dir,
// named base.EXT, and returns its path ("" when d has no image).
func SaveOne(dir string, d engine.Display, base string) (string, error) {
	m, data := Bytes(d)
	if data == nil {
		return "", nil
	}
	return saveNew(dir, base, m[len("image/"):], data)
}

// Bytes is display d's first image type and its bytes (from the result, or
// its spill file), or nil when d has no image.
func Bytes(d engine.Display) (mime string, data []byte) {
	for _, m := range engine.ImageTypes() {
		if v, ok := d.Data[m]; ok {
			data, _ = base64.StdEncoding.DecodeString(v)
		} else if path, ok := d.Spill[m]; ok {
			data, _ = os.ReadFile(path)
		}
		if len(data) > 0 {
			return m, data
		}
	}
	return "", nil
}

// saveNew writes data to dir/base.ext, or base-2.ext and so on when that
// exists, created 0600 and never following or replacing a file.
func saveNew(dir, base, ext string, data []byte) (string, error) {
	for n := 1; n < 1000; n++ {
		name := base + "." + ext
		if n > 1 {
			name = fmt.Sprintf("%s-%d.%s", base, n, ext)
		}
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return path, err
	}
	return "", fmt.Errorf("no free name for %s in %s", base, dir)
}
