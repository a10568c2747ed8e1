package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// KeyPair is a certificate and its private key, in PEM.
type KeyPair struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
	key             crypto.Signer
}

// ParseKeyPair reads a PEM certificate and its key.
func ParseKeyPair(certPEM, keyPEM []byte) (*KeyPair, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("private key cannot sign")
	}
	return &KeyPair{CertPEM: certPEM, KeyPEM: keyPEM, Cert: cert, key: signer}, nil
}

// NewCA makes a self-signed CA valid from now for validity.
func NewCA(name string, now time.Time, validity time.Duration) (*KeyPair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	return sign(tmpl, nil, now, validity)
}

// Issue signs a serving certificate for dnsNames, valid from now for
// validity.
func (ca *KeyPair) Issue(dnsNames []string, now time.Time, validity time.Duration) (*KeyPair, error) {
	if len(dnsNames) == 0 {
		return nil, errors.New("a serving certificate needs a DNS name")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsNames[0]},
		DNSNames:    dnsNames,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return sign(tmpl, ca, now, validity)
}

func sign(tmpl *x509.Certificate, ca *KeyPair, now time.Time, validity time.Duration) (*KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	// A minute of slack for clocks behind this one.
	tmpl.NotBefore = now.Add(-time.Minute).UTC()
	tmpl.NotAfter = now.Add(validity).UTC()
	parent, signer := tmpl, crypto.Signer(key)
	if ca != nil {
		parent, signer = ca.Cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return ParseKeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// ParseBundle reads the certificates of a PEM bundle, skipping what does
// not parse (a bundle someone edited must not stop the rotation that
// repairs it).
func ParseBundle(bundle []byte) []*x509.Certificate {
	var certs []*x509.Certificate
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return certs
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			certs = append(certs, c)
		}
	}
}

// Bundle is the PEM bundle of the CAs given, newest first, without
// duplicates and without those expired at now.
func Bundle(now time.Time, cas ...*x509.Certificate) []byte {
	var out []*x509.Certificate
	for _, c := range cas {
		if c == nil || !now.Before(c.NotAfter) || slices.ContainsFunc(out, func(o *x509.Certificate) bool { return o.Equal(c) }) {
			continue
		}
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b *x509.Certificate) int { return b.NotBefore.Compare(a.NotBefore) })
	var buf bytes.Buffer
	for _, c := range out {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// Verify checks that bundle trusts the serving certificate for dnsName at
// now, as the API server will.
func Verify(bundle []byte, serving *x509.Certificate, dnsName string, now time.Time) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return errors.New("the CA bundle holds no certificate")
	}
	if _, err := serving.Verify(x509.VerifyOptions{Roots: pool, DNSName: dnsName, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("the CA bundle does not trust the serving certificate: %w", err)
	}
	return nil
}
