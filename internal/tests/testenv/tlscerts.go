package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSCerts are certificates made for one test by a private CA, each in PEM
// files of a directory of the test's, for servers (PrivateRedisTLS,
// PostgresTLS) and clients (--redis-ca-file, sslrootcert) alike.
type TLSCerts struct {
	// CA is the file of the CA's certificate, which signed every pair
	// below but OtherClient.
	CA string
	// Server is for 127.0.0.1 and localhost, valid now.
	Server CertPair
	// Client is a client certificate (mTLS), valid now.
	Client CertPair
	// Expired is Server's twin that expired an hour ago.
	Expired CertPair
	// WrongName is valid now, for wrong.example only.
	WrongName CertPair
	// OtherCA is the file of a second CA's certificate: a client that
	// trusts it alone finds the server's certificate signed by an unknown
	// authority.
	OtherCA string
	// OtherClient is a client certificate signed by OtherCA, which a
	// server that trusts CA refuses.
	OtherClient CertPair
}

// CertPair is a certificate's PEM file and its key's.
type CertPair struct {
	Cert, Key string
}

// TLSCertificates makes a private CA and the certificates of TLSCerts in
// a directory that is removed when the test ends. It fails the test when
// it cannot.
func TLSCertificates(t testing.TB) *TLSCerts {
	t.Helper()
	// Not t.TempDir: a server of another user (Postgres, as root) reads
	// the certificates; PostgresTLS copies the keys it needs.
	dir := tempDir(t, "batchmr-tls-")
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := certMaker{t: t, dir: dir, now: time.Now()}
	ca, caKey := mk.ca("batchmr test CA", "ca")
	other, otherKey := mk.ca("batchmr other CA", "other-ca")
	local := func(tmpl *x509.Certificate) {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	server := x509.ExtKeyUsageServerAuth
	client := x509.ExtKeyUsageClientAuth
	return &TLSCerts{
		CA:      filepath.Join(dir, "ca.crt"),
		OtherCA: filepath.Join(dir, "other-ca.crt"),
		Server:  mk.leaf("server", ca, caKey, server, local),
		Client:  mk.leaf("client", ca, caKey, client, nil),
		Expired: mk.leaf("expired", ca, caKey, server, func(tmpl *x509.Certificate) {
			local(tmpl)
			tmpl.NotBefore, tmpl.NotAfter = mk.now.Add(-48*time.Hour), mk.now.Add(-time.Hour)
		}),
		WrongName: mk.leaf("wrong-name", ca, caKey, server, func(tmpl *x509.Certificate) {
			tmpl.DNSNames = []string{"wrong.example"}
		}),
		OtherClient: mk.leaf("other-client", other, otherKey, client, nil),
	}
}

type certMaker struct {
	t      testing.TB
	dir    string
	now    time.Time
	serial int64
}

func (m *certMaker) template(cn string) *x509.Certificate {
	m.serial++
	return &x509.Certificate{
		SerialNumber: big.NewInt(m.serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    m.now.Add(-time.Hour),
		NotAfter:     m.now.Add(24 * time.Hour),
	}
}

func (m *certMaker) ca(cn, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	tmpl := m.template(cn)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	key := m.key()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		m.t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		m.t.Fatal(err)
	}
	m.write(name+".crt", "CERTIFICATE", der)
	return cert, key
}

func (m *certMaker) leaf(name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) CertPair {
	tmpl := m.template("batchmr test " + name)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	if edit != nil {
		edit(tmpl)
	}
	key := m.key()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		m.t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		m.t.Fatal(err)
	}
	return CertPair{Cert: m.write(name+".crt", "CERTIFICATE", der), Key: m.write(name+".key", "PRIVATE KEY", keyDER)}
}

func (m *certMaker) key() *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		m.t.Fatal(err)
	}
	return key
}

func (m *certMaker) write(name, kind string, der []byte) string {
	path := filepath.Join(m.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o644); err != nil {
		m.t.Fatal(err)
	}
	return path
}
