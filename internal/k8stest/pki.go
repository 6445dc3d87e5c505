package k8stest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// authority is the cluster's certificate authority: it signs the
// apiserver's and the kubelet's serving certificates and every client's.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

func newAuthority(dir string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kerneldeck-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	a := &authority{cert: cert, key: key, dir: dir}
	return a, writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", der)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// issue writes name.crt and name.key: a certificate for cn in orgs,
// serving hosts when any are given, else a client's.
func (a *authority) issue(name, cn string, orgs []string, hosts ...string) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &k.PublicKey, a.key)
	if err != nil {
		return "", "", err
	}
	crt, key = filepath.Join(a.dir, name+".crt"), filepath.Join(a.dir, name+".key")
	if err := writePEM(crt, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	return crt, key, writePEM(key, "EC PRIVATE KEY", kder)
}

// serviceAccountKey writes the key pair the apiserver signs and checks
// service-account tokens with.
func serviceAccountKey(dir string) (pub, priv string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	pder, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pub, priv = filepath.Join(dir, "sa.pub"), filepath.Join(dir, "sa.key")
	if err := writePEM(pub, "PUBLIC KEY", pder); err != nil {
		return "", "", err
	}
	return pub, priv, writePEM(priv, "EC PRIVATE KEY", kder)
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("k8stest: %w", err)
	}
	return nil
}

// kubeconfig writes a kubeconfig for server with a client certificate,
// the certificates in it: client-go starts a goroutine that never ends to
// watch certificate files for rotation, which would outlive every test.
func kubeconfig(path, server, caFile, crtFile, keyFile string) error {
	var enc [3]string
	for i, f := range []string{caFile, crtFile, keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		enc[i] = base64.StdEncoding.EncodeToString(b)
	}
	ca, crt, key := enc[0], enc[1], enc[2]
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kd
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: kd
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: kd
  context:
    cluster: kd
    user: kd
current-context: kd
`, server, ca, crt, key)
	return os.WriteFile(path, []byte(data), 0o600)
}
