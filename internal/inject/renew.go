package inject

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// tokenFields are the fields of an OAuth token answer (RFC 6749 5.1, and
// OpenID Connect's id_token) that a secret may be renewed from.
var tokenFields = []string{"access_token", "refresh_token", "id_token"}

// maxTokenBody bounds a request to or an answer from a token endpoint that
// is read whole to be rewritten.
const maxTokenBody = 1 << 20

// maxPast bounds the past values of a renewed secret whose echoes are still
// redacted: a token revoked long ago is worthless.
const maxPast = 16

// swapBody puts the values of secrets renewed at the request's host in its
// body, in place of their placeholders: a refresh grant carries the
// refresh token there (JSON or a form; a placeholder is the same in both).
func (in *Injector) swapBody(r *http.Request, at []*boundSecret) error {
	if len(at) == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTokenBody+1))
	r.Body.Close()
	if err != nil {
		return err
	}
	if len(body) > maxTokenBody {
		return fmt.Errorf("a request to a token endpoint larger than %d bytes", maxTokenBody)
	}
	for _, s := range at {
		body = bytes.ReplaceAll(body, []byte(s.Placeholder), []byte(in.value(s)))
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	r.Header.Del("Content-Length")
	return nil
}

// renew reads a token endpoint's answer (body, decoded): each secret
// renewed there whose field it holds takes the field's value as its own,
// and the field is given the placeholder. It returns the answer to pass on.
// Anything but a JSON object is passed on as it is (and redacted).
func (in *Injector) renew(resp *http.Response, body io.Reader, at []*boundSecret) (io.Reader, error) {
	if len(at) == 0 || resp.StatusCode != http.StatusOK {
		return body, nil
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" && !strings.HasSuffix(mt, "+json") {
		return body, nil
	}
	data, err := io.ReadAll(io.LimitReader(body, maxTokenBody+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxTokenBody {
		return nil, fmt.Errorf("a token endpoint answered with more than %d bytes", maxTokenBody)
	}
	var answer map[string]json.RawMessage
	if json.Unmarshal(data, &answer) != nil {
		return bytes.NewReader(data), nil
	}
	changed := false
	for _, s := range at {
		raw, ok := answer[s.TokenField]
		var v string
		if !ok || json.Unmarshal(raw, &v) != nil || v == "" || v == s.Placeholder {
			continue
		}
		in.mu.Lock()
		if v != s.Value {
			s.past = append(s.past, s.Value)
			if len(s.past) > maxPast {
				s.past = s.past[1:]
			}
			s.Value = v
		}
		in.mu.Unlock()
		in.cfg.OnUpdate(s.Placeholder, v)
		answer[s.TokenField], _ = json.Marshal(s.Placeholder)
		changed = true
	}
	if !changed {
		return bytes.NewReader(data), nil
	}
	out, err := json.Marshal(answer)
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(out), nil
}
