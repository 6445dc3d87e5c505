// Package imagetest makes test images and reads back the images a program
// drew on a terminal with the kitty graphics protocol or sixel.
package imagetest

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/png"
	"regexp"
	"strings"
	"testing"

	"github.com/mattn/go-sixel"
)

// Halves is a w×h PNG, red on the left half and blue on the right.
func Halves(t testing.TB, w, h int) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			c := color.NRGBA{R: 255, A: 255}
			if x >= w/2 {
				c = color.NRGBA{B: 255, A: 255}
			}
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// IsRed says whether c is clearly red (the left half of Halves).
func IsRed(c color.Color) bool {
	r, _, b, _ := c.RGBA()
	return r >= 0xc000 && b <= 0x4000
}

var (
	kittyChunk = regexp.MustCompile("\x1b_G([^;\x1b]*);([A-Za-z0-9+/=]*)\x1b\\\\")
	sixelDCS   = regexp.MustCompile("\x1bP[0-9;]*q[^\x1b]*\x1b\\\\")
)

// Kitty reassembles the first whole PNG that the kitty graphics escapes in
// out transmit, with the keys of its first chunk; ok is false when there
// is none yet.
func Kitty(out string) (keys string, img image.Image, ok bool) {
	var data string
	for i, m := range kittyChunk.FindAllStringSubmatch(out, -1) {
		if i == 0 {
			keys = m[1]
		}
		data += m[2]
		if strings.Contains(","+m[1]+",", ",m=0,") {
			raw, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				return keys, nil, false
			}
			img, err := png.Decode(bytes.NewReader(raw))
			return keys, img, err == nil
		}
	}
	return keys, nil, false
}

// Sixel decodes the first sixel drawing in out; ok is false when there is
// none yet.
func Sixel(out string) (image.Image, bool) {
	m := sixelDCS.FindString(out)
	if m == "" {
		return nil, false
	}
	var img image.Image
	if err := sixel.NewDecoder(strings.NewReader(m)).Decode(&img); err != nil {
		return nil, false
	}
	return img, true
}
