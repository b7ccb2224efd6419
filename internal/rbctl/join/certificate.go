package join

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// waitForCertificate waits for the request to be signed, denied or failed.
func waitForCertificate(ctx context.Context, kc ctrlclient.Client, name string, timeout time.Duration) ([]byte, error) {
	var cert []byte
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var csr certificatesv1.CertificateSigningRequest
		if err := kc.Get(ctx, ctrlclient.ObjectKey{Name: name}, &csr); err != nil {
			return false, fmt.Errorf("reading CertificateSigningRequest %s: %w", name, err)
		}
		for _, c := range csr.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("CertificateSigningRequest %s %s: %s %s", name, c.Type, c.Reason, c.Message)
			}
		}
		cert = csr.Status.Certificate
		return len(cert) > 0, nil
	})
	if wait.Interrupted(err) {
		return nil, fmt.Errorf("CertificateSigningRequest %s not signed within %s: it stays for rbctl join approve; run join again to wait again", name, timeout)
	}
	return cert, err
}

// verifyMemberCert checks that the signed certificate names the member and
// is a client certificate of the CA the member will trust for the broker.
func verifyMemberCert(certPEM, caPEM []byte, id string) (*x509.Certificate, error) {
	leaf, err := ParseCertificate(certPEM)
	if err != nil {
		return nil, fmt.Errorf("the signed certificate: %w", err)
	}
	if leaf.Subject.CommonName != id {
		return nil, fmt.Errorf("the signed certificate names CN=%q, not %q", leaf.Subject.CommonName, id)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the broker's ca.crt holds no PEM certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("the signed certificate is not a client certificate of the broker's CA: %w", err)
	}
	return leaf, nil
}

// ParseCertificate parses the first PEM block of certPEM as a certificate:
// a member's leaf, whose CN is its cluster id.
func ParseCertificate(certPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return x509.ParseCertificate(block.Bytes)
}
