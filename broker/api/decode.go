package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/model"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
)

// MaxBodyBytes bounds every request body the broker reads.
const MaxBodyBytes = 64 << 10

// InvalidError is a client mistake: the server answers 400 with Error() as the message.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

func invalid(format string, a ...any) error { return &InvalidError{Msg: fmt.Sprintf(format, a...)} }

// Decode reads exactly one JSON object into v, strictly (sigs.k8s.io/json,
// as the Kubernetes API server decodes): keys match the fields' names
// exactly, case included, and none is unknown or given twice, so what the
// broker acts on is what any other JSON reader of the same body would see.
// Trailing data is refused too. Errors are *InvalidError naming the problem,
// or *http.MaxBytesError when the body was cut by http.MaxBytesReader.
func Decode(r io.Reader, v any) error {
	data, err := readBody(r, -1)
	if err != nil {
		return err
	}
	return decodeStrict(data, v)
}

// readBody reads a request body (a *http.MaxBytesError is kept as it is),
// into one buffer of size bytes when size, its length, is known (> 0).
func readBody(r io.Reader, size int64) ([]byte, error) {
	var data []byte
	var err error
	if size > 0 {
		buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
		_, err = buf.ReadFrom(r)
		data = buf.Bytes()
	} else {
		data, err = io.ReadAll(r)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, err
		}
		return nil, invalid("read body: %v", err)
	}
	return data, nil
}

func decodeStrict(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return invalid("empty body: a JSON object is required")
	}
	strict, err := kjson.UnmarshalStrict(data, v)
	if err != nil {
		return invalid("malformed JSON: %v", err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return invalid("JSON: %s (keys are case-sensitive, each given once)", strings.Join(msgs, "; "))
	}
	return nil
}

// Limits are the server's bounds on requests.
type Limits struct {
	DefaultDuration time.Duration
	MaxDuration     time.Duration
}

func (l Limits) duration(s string) (time.Duration, error) {
	if s == "" {
		return l.DefaultDuration, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("duration: %q is not a Go duration such as 30m or 1h", s)
	}
	if d <= 0 {
		return 0, invalid("duration: must be positive, got %s", s)
	}
	if l.MaxDuration > 0 && d > l.MaxDuration {
		return 0, invalid("duration: %s exceeds the maximum of %s", s, l.MaxDuration)
	}
	return d, nil
}

// lease parses a request's lease: at least MinLease, at most the maximum duration.
func (l Limits) lease(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("lease: %q is not a Go duration such as 2m", s)
	}
	if d < MinLease {
		return 0, invalid("lease: %s is shorter than the minimum of %s", s, MinLease)
	}
	if l.MaxDuration > 0 && d > l.MaxDuration {
		return 0, invalid("lease: %s exceeds the maximum duration of %s", s, l.MaxDuration)
	}
	return d, nil
}

// MinLease is the shortest lease a request may ask for.
const MinLease = time.Second

// ValidateClusterID checks a cluster identity (model.ValidateClusterID) as
// a 400 answer.
func ValidateClusterID(id string) error {
	if err := model.ValidateClusterID(id); err != nil {
		return invalid("%s", err)
	}
	return nil
}

// ValidateReservationID checks a client-chosen reservation id: agents use it
// as a Kubernetes object name, so it must be a DNS-1123 subdomain.
func ValidateReservationID(id string) error {
	if id == "" {
		return invalid("id: required (client-chosen, makes the request idempotent)")
	}
	if isDNS1123Subdomain(id) {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
		return invalid("id %q: %s", id, strings.Join(errs, "; "))
	}
	return nil
}

// isDNS1123Subdomain is validation.IsDNS1123Subdomain's answer without its
// regular expression, which costs about 16 µs for a long id: a renewal of
// 5,000 ids spent 80 ms of the broker's CPU on it. The message of a refusal
// is still validation's (TestIsDNS1123Subdomain holds them to one answer).
func isDNS1123Subdomain(s string) bool {
	if len(s) == 0 || len(s) > validation.DNS1123SubdomainMaxLength {
		return false
	}
	labelStart := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
			continue
		}
		label := s[labelStart:i] // each label: [a-z0-9]([-a-z0-9]*[a-z0-9])?
		if len(label) == 0 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		labelStart = i + 1
	}
	return true
}

// ValidateQualifiedReservationID checks a reservation named with its
// requester, "<requester>/<id>" (ids are scoped per requester).
func ValidateQualifiedReservationID(qid string) error {
	requester, id, ok := strings.Cut(qid, "/")
	if !ok {
		return invalid("%q: not <requester>/<id> (reservation ids are scoped per requester)", qid)
	}
	if err := ValidateClusterID(requester); err != nil {
		return invalid("%q: requester: %v", qid, err)
	}
	if err := ValidateReservationID(id); err != nil {
		return invalid("%q: %v", qid, err)
	}
	return nil
}

func validateLabels(field string, labels map[string]string) error {
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return invalid("%s: key %q: %s", field, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return invalid("%s[%s]: %s", field, k, strings.Join(errs, "; "))
		}
	}
	return nil
}

func validateText(field, s string, max int) error {
	if len(s) > max {
		return invalid("%s: longer than %d characters", field, max)
	}
	return nil
}

func validateEndpoint(field, s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return invalid("%s: %q is not an https:// URL", field, s)
	}
	return validateText(field, s, 2048)
}
