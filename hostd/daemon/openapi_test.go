package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// apiSpec is hostd/openapi.yaml, loaded and validated once, with a router
// over its paths.
var apiSpec = sync.OnceValues(func() (routers.Router, error) {
	doc, err := openapi3.NewLoader().LoadFromFile("../openapi.yaml")
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, err
	}
	return legacy.NewRouter(doc)
})

// conformance checks each answer of a daemon against hostd/openapi.yaml:
// a status the operation documents (or its default), a content type it
// documents for that status, and a body its schema accepts (each line of
// an NDJSON stream, one by one). Every test daemon (startDaemon) serves
// through it, so every answer the tests provoke, errors included, is
// checked; what does not conform fails the test when it ends.
type conformance struct {
	mu       sync.Mutex
	problems []string
}

func (c *conformance) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.problems) < 20 {
		c.problems = append(c.problems, fmt.Sprintf(format, args...))
	}
}

// report fails t with what did not conform.
func (c *conformance) report(t testing.TB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.problems {
		t.Errorf("answer not as hostd/openapi.yaml says: %s", p)
	}
}

// wrap returns h with its answers checked.
func (c *conformance) wrap(t testing.TB, h http.Handler) http.Handler {
	router, err := apiSpec()
	if err != nil {
		t.Fatalf("hostd/openapi.yaml: %v", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The route, found on a copy addressed as the spec's server.
		rr := r.Clone(r.Context())
		rr.URL.Scheme, rr.URL.Host, rr.Host = "http", "localhost", "localhost"
		route, params, err := router.FindRoute(rr)
		tee := &teeWriter{recorder: recorder{ResponseWriter: w}}
		h.ServeHTTP(tee, r)
		if err != nil {
			// Not a path of the API: the daemon's own 404 or 405.
			if tee.status() != http.StatusNotFound && tee.status() != http.StatusMethodNotAllowed {
				c.fail("%s %s: answered %d, but the spec has no such operation", r.Method, r.URL.Path, tee.status())
			}
			return
		}
		c.check(route, params, r, tee)
	})
}

func (c *conformance) check(route *routers.Route, params map[string]string, r *http.Request, tee *teeWriter) {
	what := fmt.Sprintf("%s %s -> %d", r.Method, r.URL.Path, tee.status())
	ct, _, _ := strings.Cut(tee.Header().Get("Content-Type"), ";")
	if ct == "application/x-ndjson" {
		resp := route.Operation.Responses.Status(tee.status())
		if resp == nil {
			resp = route.Operation.Responses.Default()
		}
		var mt *openapi3.MediaType
		if resp != nil {
			mt = resp.Value.Content.Get(ct)
		}
		if mt == nil || mt.Schema == nil {
			c.fail("%s: no application/x-ndjson answer documented for this status", what)
			return
		}
		sc := bufio.NewScanner(bytes.NewReader(tee.body.Bytes()))
		sc.Buffer(nil, 16<<20)
		for n := 1; sc.Scan(); n++ {
			v, err := decodeLine(sc.Bytes())
			if err == nil {
				err = mt.Schema.Value.VisitJSON(v)
			}
			if err != nil {
				c.fail("%s: line %d %.200q: %v", what, n, sc.Bytes(), err)
				return
			}
		}
		return
	}
	in := &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	err := openapi3filter.ValidateResponse(r.Context(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: tee.status(), Header: tee.Header(),
		Body:    io.NopCloser(bytes.NewReader(tee.body.Bytes())),
		Options: &openapi3filter.Options{IncludeResponseStatus: true}})
	if err != nil {
		c.fail("%s: %v", what, err)
	}
}

// decodeLine decodes one JSON value as the schema validator wants it
// (numbers as float64).
func decodeLine(b []byte) (any, error) {
	var v any
	err := json.Unmarshal(b, &v)
	return v, err
}

// teeWriter passes an answer on and keeps a copy of it: the daemon's own
// status recorder (flushing, unwrapping) plus the body.
type teeWriter struct {
	recorder
	body bytes.Buffer
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.body.Write(p)
	return w.recorder.Write(p)
}

func (w *teeWriter) status() int {
	if w.recorder.status == 0 {
		return http.StatusOK
	}
	return w.recorder.status
}
