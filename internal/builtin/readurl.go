package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"codeberg.org/readeck/go-readability/v2"
)

// read_url defaults, from the seed.
const (
	DefaultReadTimeout  = 10 * time.Second
	DefaultReadMaxBytes = 200000
	maxReadMaxBytes     = 5 << 20
	maxRedirects        = 5
)

// ReadURLArgs is the input of read_url.
type ReadURLArgs struct {
	URL       string            `json:"url" jsonschema:"description=A public http or https URL."`
	Method    string            `json:"method,omitempty" jsonschema:"enum=GET,enum=HEAD"`
	Mode      string            `json:"mode,omitempty" jsonschema:"enum=auto,enum=text,enum=html_text,enum=json"`
	MaxBytes  int               `json:"maxBytes,omitempty" jsonschema:"minimum=1,maximum=5242880"`
	TimeoutMs int               `json:"timeoutMs,omitempty" jsonschema:"minimum=1,maximum=120000"`
	Headers   map[string]string `json:"headers,omitempty"`
}

// ReadURLResult is the seed's read_url_result, on success and failure.
type ReadURLResult struct {
	Kind        string `json:"kind"`
	OK          bool   `json:"ok"`
	URL         string `json:"url"`
	FinalURL    string `json:"finalUrl,omitempty"`
	Status      int    `json:"status,omitempty"`
	StatusText  string `json:"statusText,omitempty"`
	ContentType string `json:"contentType,omitempty"`
	Mode        string `json:"mode,omitempty"`
	Text        string `json:"text,omitempty"`
	JSON        any    `json:"json,omitempty"`
	Title       string `json:"title,omitempty"`
	Bytes       int    `json:"bytes"`
	Truncated   bool   `json:"truncated"`
	// Failures: Reason is the category, Error the detail.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Failure categories of read_url.
const (
	ReasonInvalidURL         = "invalid_url"
	ReasonInvalidMethod      = "invalid_method"
	ReasonInvalidMode        = "invalid_mode"
	ReasonAddressRefused     = "address_refused"
	ReasonHTTPError          = "http_error"
	ReasonTimeout            = "timeout"
	ReasonFetchFailed        = "fetch_failed"
	ReasonUnsupportedContent = "unsupported_content_type"
	ReasonBlockedPage        = "blocked_page"
	ReasonEmptyContent       = "empty_content"
)

// URLReader performs read_url.
type URLReader struct {
	client *http.Client
}

// NewURLReader returns a reader whose connections go through guard.
func NewURLReader(guard NetGuard) *URLReader {
	return &URLReader{client: guard.Client(maxRedirects)}
}

// blockedMarkers are texts of bot walls and challenge pages.
var blockedMarkers = regexp.MustCompile(`(?i)attention required!|cf-challenge|captcha|are you a robot|enable javascript and cookies to continue|access denied`)

// Read fetches one page. Every failure is a result with ok false and a
// reason, never an error: the planner reads it like any other result.
func (r *URLReader) Read(ctx context.Context, in ReadURLArgs) ReadURLResult {
	res := ReadURLResult{Kind: "read_url_result", URL: in.URL}
	fail := func(reason string, format string, args ...any) ReadURLResult {
		res.OK, res.Reason, res.Error = false, reason, fmt.Sprintf(format, args...)
		return res
	}
	u, err := url.Parse(strings.TrimSpace(in.URL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fail(ReasonInvalidURL, "url must be an absolute http or https URL")
	}
	method := strings.ToUpper(in.Method)
	switch method {
	case "":
		method = http.MethodGet
	case http.MethodGet, http.MethodHead:
	default:
		return fail(ReasonInvalidMethod, "method %q is not supported (GET or HEAD)", in.Method)
	}
	mode := in.Mode
	switch mode {
	case "":
		mode = "auto"
	case "auto", "text", "html_text", "json":
	default:
		return fail(ReasonInvalidMode, "mode %q is not supported (auto, text, html_text or json)", in.Mode)
	}
	maxBytes := in.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultReadMaxBytes
	}
	maxBytes = min(maxBytes, maxReadMaxBytes)
	timeout := DefaultReadTimeout
	if in.TimeoutMs > 0 {
		timeout = time.Duration(in.TimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return fail(ReasonInvalidURL, "%v", err)
	}
	req.Header.Set("User-Agent", "actionbus-read_url/1")
	req.Header.Set("Accept", "text/html,application/xhtml+xml,application/json,text/plain;q=0.9,*/*;q=0.5")
	for k, v := range in.Headers {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		switch {
		case errors.Is(err, ErrAddressRefused):
			return fail(ReasonAddressRefused, "%v", unwrapURLError(err))
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
			return fail(ReasonTimeout, "no answer within %s", timeout)
		}
		return fail(ReasonFetchFailed, "%v", unwrapURLError(err))
	}
	defer resp.Body.Close()
	res.Status, res.StatusText = resp.StatusCode, http.StatusText(resp.StatusCode)
	res.FinalURL = resp.Request.URL.String()
	res.ContentType = resp.Header.Get("Content-Type")
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxBytes)+1))
	if err != nil {
		if ctx.Err() != nil {
			return fail(ReasonTimeout, "the body did not arrive within %s", timeout)
		}
		return fail(ReasonFetchFailed, "reading the body: %v", err)
	}
	if len(body) > maxBytes {
		body, res.Truncated = body[:maxBytes], true
	}
	res.Bytes = len(body)
	switch {
	case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusUnavailableForLegalReasons:
		return fail(ReasonBlockedPage, "the site refused the request (HTTP %d)", resp.StatusCode)
	case resp.StatusCode >= 400:
		return fail(ReasonHTTPError, "HTTP %d %s", resp.StatusCode, res.StatusText)
	}
	if method == http.MethodHead {
		res.OK, res.Mode = true, mode
		return res
	}
	media, _, _ := mime.ParseMediaType(res.ContentType)
	isHTML := media == "text/html" || media == "application/xhtml+xml"
	isJSON := media == "application/json" || strings.HasSuffix(media, "+json")
	isText := strings.HasPrefix(media, "text/") || isJSON || media == "application/xml" || strings.HasSuffix(media, "+xml")
	if mode == "auto" {
		switch {
		case isHTML:
			mode = "html_text"
		case isJSON:
			mode = "json"
		case isText:
			mode = "text"
		default:
			return fail(ReasonUnsupportedContent, "content type %q is not text", res.ContentType)
		}
	}
	res.Mode = mode
	if !isText && !(media == "" && utf8.Valid(body)) {
		return fail(ReasonUnsupportedContent, "content type %q is not text", res.ContentType)
	}
	switch mode {
	case "json":
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			if res.Truncated {
				return fail(ReasonUnsupportedContent, "the JSON body is larger than maxBytes (%d)", maxBytes)
			}
			return fail(ReasonUnsupportedContent, "the body is not JSON: %v", err)
		}
		res.JSON = v
	case "html_text":
		art, err := readability.FromReader(bytes.NewReader(body), resp.Request.URL)
		if err != nil {
			return fail(ReasonEmptyContent, "no readable content: %v", err)
		}
		var b strings.Builder
		if art.Node != nil {
			_ = art.RenderText(&b)
		}
		res.Title, res.Text = strings.TrimSpace(art.Title()), collapseSpace(b.String())
	default:
		res.Text = strings.ToValidUTF8(string(body), "")
	}
	if blockedMarkers.MatchString(res.Title) || (mode == "html_text" && len(res.Text) < 400 && blockedMarkers.MatchString(res.Text)) {
		return fail(ReasonBlockedPage, "the page is a bot wall or challenge page")
	}
	if mode != "json" && strings.TrimSpace(res.Text) == "" {
		return fail(ReasonEmptyContent, "the page has no readable text")
	}
	res.OK = true
	return res
}

var blankLines = regexp.MustCompile(`\n{3,}`)

func collapseSpace(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.TrimSpace(blankLines.ReplaceAllString(strings.Join(lines, "\n"), "\n\n"))
}

// unwrapURLError drops the "Get "...": " prefix of url.Error.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
