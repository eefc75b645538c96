package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// certFiles serves the certificate of --tls-cert and --tls-key, reading
// the files again at each TLS handshake (two small reads) and taking the
// pair anew when they changed: a renewed certificate needs no restart.
// A pair that does not parse (one file written, not yet the other) is
// logged and the previous one served.
type certFiles struct {
	certFile, keyFile string
	log               *slog.Logger

	mu              sync.Mutex
	certPEM, keyPEM []byte // as last read
	cert            *tls.Certificate
}

// loadCertFiles reads the pair, or returns an error naming the files and
// what to give.
func loadCertFiles(certFile, keyFile string, log *slog.Logger) (*certFiles, error) {
	c := &certFiles{certFile: certFile, keyFile: keyFile, log: log}
	certPEM, keyPEM, err := c.read()
	if err == nil {
		var cert tls.Certificate
		if cert, err = tls.X509KeyPair(certPEM, keyPEM); err == nil {
			c.certPEM, c.keyPEM, c.cert = certPEM, keyPEM, &cert
			return c, nil
		}
	}
	return nil, fmt.Errorf("--tls-cert %s --tls-key %s: %w: give the PEM file of the console's certificate (its chain, leaf first) and the PEM file of that certificate's private key", certFile, keyFile, err)
}

func (c *certFiles) read() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(c.certFile); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = os.ReadFile(c.keyFile); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

// get is the server's tls.Config.GetCertificate.
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	certPEM, keyPEM, err := c.read()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || (bytes.Equal(certPEM, c.certPEM) && bytes.Equal(keyPEM, c.keyPEM)) {
		return c.cert, nil // unchanged, or being replaced: the pair in hand
	}
	c.certPEM, c.keyPEM = certPEM, keyPEM
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		c.log.Warn("scheduler: the console's certificate files changed and do not hold a pair: still serving the previous certificate", "tls_cert", c.certFile, "tls_key", c.keyFile, "error", err)
		return c.cert, nil
	}
	c.cert = &cert
	c.log.Info("scheduler: the console serves its renewed certificate", "tls_cert", c.certFile)
	return c.cert, nil
}
