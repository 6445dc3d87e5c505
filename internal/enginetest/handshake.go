package enginetest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/kerneldeck/kerneldeck/internal/kernelauth"
)

// Handshake connects to a runner's socket and does the engine's side of its
// challenge with secret: nil means the runner proved it holds that secret
// and accepted this side as holding it.
func Handshake(sock, secret string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	var hello struct{ Op, Nonce string }
	line, err := br.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &hello) != nil || hello.Op != "hello" {
		return fmt.Errorf("no challenge (%q): %v", line, err)
	}
	mine := kernelauth.NewNonce()
	auth, _ := json.Marshal(map[string]string{"op": "auth", "mac": kernelauth.MAC(secret, kernelauth.Engine, hello.Nonce), "nonce": mine})
	if _, err := c.Write(append(auth, '\n')); err != nil {
		return err
	}
	line, err = br.ReadBytes('\n')
	var ok struct{ Op, MAC string }
	if err != nil || json.Unmarshal(line, &ok) != nil || ok.Op != "auth_ok" {
		return fmt.Errorf("refused (%q): %v", line, err)
	}
	if !kernelauth.Valid(secret, ok.MAC, kernelauth.Runner, mine) {
		return errors.New("the runner's answer is not a MAC under the secret")
	}
	return nil
}
