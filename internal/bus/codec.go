package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// Mode is a content mode of the CloudEvents NATS protocol binding.
type Mode int

const (
	// ModeBinary puts every attribute in its own ce- header and the data,
	// unchanged, in the message body. It is the default.
	ModeBinary Mode = iota
	// ModeStructured puts the whole event, in the JSON event format, in the
	// message body with Content-Type application/cloudevents+json.
	ModeStructured
)

// String returns "binary" or "structured".
func (m Mode) String() string {
	if m == ModeStructured {
		return "structured"
	}
	return "binary"
}

const (
	headerPrefix = "ce-"
	// HeaderContentType marks a structured-mode message.
	HeaderContentType = "Content-Type"
	// StructuredContentType is the Content-Type of structured-mode messages.
	StructuredContentType = "application/cloudevents+json; charset=UTF-8"
	// HeaderMsgID is the JetStream deduplication header; actionbus sets it
	// to the event id.
	HeaderMsgID = "Nats-Msg-Id"
)

// Encode renders e as a NATS message on subject in the given content mode.
// The event must be valid (see event.Event.Validate); Encode does not change
// it. Nats-Msg-Id is set to the event id so JetStream deduplicates
// republished events.
func Encode(subject string, e *event.Event, mode Mode) (*nats.Msg, error) {
	if err := events.CheckEnvelope(e); err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: subject, Header: nats.Header{}}
	msg.Header[HeaderMsgID] = []string{e.ID()}
	if mode == ModeStructured {
		out := e.Clone()
		// Data that is not JSON text (msgpack, or bytes that only claim to
		// be JSON) travels as data_base64, as the JSON event format allows.
		if len(out.DataEncoded) > 0 && (!events.IsJSONMediaType(out.DataMediaType()) || !json.Valid(out.DataEncoded)) {
			out.DataBase64 = true
		}
		body, err := json.Marshal(out)
		if err != nil {
			return nil, fmt.Errorf("events: encode structured event: %w", err)
		}
		msg.Header[HeaderContentType] = []string{StructuredContentType}
		msg.Data = body
		return msg, nil
	}
	set := func(name, value string) {
		if value != "" {
			msg.Header[headerPrefix+name] = []string{PercentEncode(value)}
		}
	}
	set("specversion", e.SpecVersion())
	set("id", e.ID())
	set("source", e.Source())
	set("type", e.Type())
	set("subject", e.Subject())
	set("datacontenttype", e.DataContentType())
	set("dataschema", e.DataSchema())
	if t := e.Time(); !t.IsZero() {
		set("time", types.FormatTime(t))
	}
	for name, v := range e.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "extension %q: %w", name, err)
		}
		set(name, s)
	}
	msg.Data = e.Data()
	return msg, nil
}

// IsStructured reports whether a message is in structured content mode: its
// Content-Type header (matched case-insensitively) is application/cloudevents
// or application/cloudevents+<format>.
func IsStructured(h nats.Header) bool {
	ct := headerValue(h, HeaderContentType)
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(strings.Split(ct, ";")[0]))
	}
	return mt == "application/cloudevents" || strings.HasPrefix(mt, "application/cloudevents+")
}

// Decode reads a CloudEvent from a NATS message in either content mode.
// Errors are *actionbus.Error with code malformed_event or
// unsupported_content_type; Decode never panics on input.
func Decode(subject string, h nats.Header, body []byte) (*event.Event, error) {
	if IsStructured(h) {
		return decodeStructured(h, body)
	}
	return decodeBinary(h, body)
}

func decodeStructured(h nats.Header, body []byte) (*event.Event, error) {
	mt, _, _ := mime.ParseMediaType(headerValue(h, HeaderContentType))
	if mt != "" && mt != "application/cloudevents" && mt != "application/cloudevents+json" {
		return nil, actionbus.Errorf(actionbus.CodeUnsupportedContent, "structured event format %q is not supported (only JSON)", mt)
	}
	e := event.New()
	if err := json.Unmarshal(body, &e); err != nil {
		return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "structured event: %w", err)
	}
	if e.SpecVersion() != event.CloudEventsVersionV1 {
		return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "unsupported specversion %q", e.SpecVersion())
	}
	if err := events.CheckEnvelope(&e); err != nil {
		return nil, err
	}
	return &e, nil
}

func decodeBinary(h nats.Header, body []byte) (*event.Event, error) {
	attrs := make(map[string]string, 8)
	for key, values := range h {
		lower := strings.ToLower(key)
		name, ok := strings.CutPrefix(lower, headerPrefix)
		if !ok {
			continue
		}
		if len(values) != 1 {
			return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "header %s has %d values, want exactly one", key, len(values))
		}
		if _, dup := attrs[name]; dup {
			return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "attribute %s appears in more than one header", name)
		}
		v, err := DecodeHeaderValue(values[0])
		if err != nil {
			return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "header %s: %w", key, err)
		}
		attrs[name] = v
	}
	sv, ok := attrs["specversion"]
	if !ok {
		return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "not a cloudevent: no ce-specversion header and no structured content type")
	}
	if sv != event.CloudEventsVersionV1 {
		return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "unsupported specversion %q", sv)
	}
	e := event.New()
	for name, v := range attrs {
		switch name {
		case "specversion":
		case "id":
			e.SetID(v)
		case "source":
			e.SetSource(v)
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "datacontenttype":
			e.SetDataContentType(v)
		case "dataschema":
			e.SetDataSchema(v)
		case "time":
			t, err := types.ParseTime(v)
			if err != nil {
				return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "ce-time: %w", err)
			}
			e.SetTime(t)
		default:
			if !validExtensionName(name) {
				return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "invalid extension attribute name %q (lower-case letters and digits only)", name)
			}
			e.SetExtension(name, v)
		}
	}
	if len(body) > 0 {
		e.DataEncoded = body
	}
	if err := events.CheckEnvelope(&e); err != nil {
		return nil, err
	}
	return &e, nil
}

func validExtensionName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// headerValue returns the first value of a header matched
// case-insensitively (NATS header names are case-insensitive; nats.Header is
// not).
func headerValue(h nats.Header, name string) string {
	if v, ok := h[name]; ok && len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// PercentEncode encodes an attribute value for a NATS header as the binding
// requires: space, double-quote, percent and every byte outside printable
// ASCII (U+0021-U+007E) become %XY with upper-case hex.
func PercentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&0x0f])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func needsEscape(c byte) bool {
	return c < 0x21 || c > 0x7e || c == '"' || c == '%'
}

var (
	errBadPercent = errors.New("invalid percent-encoding")
	errBadUTF8    = errors.New("percent-decoded value is not valid UTF-8")
	errBadQuote   = errors.New("unterminated double-quoted string")
)

// DecodeHeaderValue reverses the binding's header encoding: it first
// unescapes double-quoted strings (RFC 7230 section 3.2.6, kept for senders
// of older binding versions), then performs one round of percent-decoding
// (hex digits of either case), and rejects results that are not valid UTF-8
// (overlong encodings included).
func DecodeHeaderValue(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if strings.IndexByte(v, '"') >= 0 {
		var err error
		if v, err = unquote(v); err != nil {
			return "", err
		}
	}
	if strings.IndexByte(v, '%') < 0 {
		if !utf8.ValidString(v) {
			return "", errBadUTF8
		}
		return v, nil
	}
	b := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(v) {
			return "", errBadPercent
		}
		hi, ok1 := unhex(v[i+1])
		lo, ok2 := unhex(v[i+2])
		if !ok1 || !ok2 {
			return "", errBadPercent
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(b) {
		return "", errBadUTF8
	}
	return string(b), nil
}

// unquote removes RFC 7230 double-quoted-string syntax wherever it appears
// in v, processing backslash escapes inside quotes.
func unquote(v string) (string, error) {
	var b strings.Builder
	inQuote := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '"':
			inQuote = !inQuote
		case c == '\\' && inQuote:
			if i+1 >= len(v) {
				return "", errBadQuote
			}
			i++
			b.WriteByte(v[i])
		default:
			b.WriteByte(c)
		}
	}
	if inQuote {
		return "", errBadQuote
	}
	return b.String(), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
