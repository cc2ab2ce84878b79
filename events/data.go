package events

import (
	"bytes"
	"encoding/json"
	"mime"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/jsoncodec"
)

// Data content types.
const (
	// ContentTypeJSON is the default data content type.
	ContentTypeJSON = "application/json"
	// ContentTypeMsgpack selects msgpack data.
	ContentTypeMsgpack = "application/msgpack"
)

type dataCodec int

const (
	codecUnknown dataCodec = iota
	codecJSON
	codecMsgpack
)

// codecFor chooses the data codec from a datacontenttype. An absent
// datacontenttype means JSON, as the CloudEvents spec says.
func codecFor(contentType string) dataCodec {
	if contentType == "" || contentType == ContentTypeJSON {
		return codecJSON
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return codecUnknown
	}
	switch {
	case isJSONMediaType(mt):
		return codecJSON
	case mt == "application/msgpack", mt == "application/x-msgpack", mt == "application/vnd.msgpack":
		return codecMsgpack
	}
	return codecUnknown
}

// SupportedContentType reports whether contentType names a data codec
// this package has: JSON ("" means JSON, as do application/json,
// text/json and any +json type) or msgpack (application/msgpack,
// application/x-msgpack, application/vnd.msgpack).
func SupportedContentType(contentType string) bool {
	return codecFor(contentType) != codecUnknown
}

// IsJSONMediaType reports whether the media type mt (without
// parameters) is JSON: "", application/json, text/json or any +json type.
func IsJSONMediaType(mt string) bool { return isJSONMediaType(mt) }

func isJSONMediaType(mt string) bool {
	mt = strings.ToLower(mt)
	return mt == "" || mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// SetData encodes v as the event's data with the codec chosen by
// contentType ("" means JSON).
func SetData(e *event.Event, contentType string, v any) error {
	if contentType == "" {
		contentType = ContentTypeJSON
	}
	var (
		b   []byte
		err error
	)
	switch codecFor(contentType) {
	case codecJSON:
		b, err = jsoncodec.Marshal(v)
	case codecMsgpack:
		b, err = marshalMsgpack(v)
	default:
		return actionbus.Errorf(actionbus.CodeUnsupportedContent, "datacontenttype %q is not supported (JSON or msgpack)", contentType)
	}
	if err != nil {
		return actionbus.Errorf(actionbus.CodeMalformedEvent, "encode data: %w", err)
	}
	e.SetDataContentType(contentType)
	e.DataEncoded = b
	e.DataBase64 = false
	return nil
}

// DataAs decodes the event's data into v (a pointer) with the codec chosen
// by its datacontenttype. Errors are *actionbus.Error with code
// unsupported_content_type or malformed_event.
func DataAs(e *event.Event, v any) error {
	data := e.Data()
	switch codecFor(e.DataContentType()) {
	case codecJSON:
		if len(data) == 0 {
			return actionbus.Errorf(actionbus.CodeMalformedEvent, "event has no data")
		}
		if err := jsoncodec.Unmarshal(data, v); err != nil {
			return actionbus.Errorf(actionbus.CodeMalformedEvent, "decode JSON data: %w", err)
		}
	case codecMsgpack:
		if len(data) == 0 {
			return actionbus.Errorf(actionbus.CodeMalformedEvent, "event has no data")
		}
		if err := unmarshalMsgpack(data, v); err != nil {
			return actionbus.Errorf(actionbus.CodeMalformedEvent, "decode msgpack data: %w", err)
		}
	default:
		return actionbus.Errorf(actionbus.CodeUnsupportedContent, "datacontenttype %q is not supported (JSON or msgpack)", e.DataContentType())
	}
	return nil
}

// jsonInstance returns the event's data as a JSON document, for schema
// validation: JSON data as is, msgpack data transcoded.
func jsonInstance(e *event.Event) ([]byte, error) {
	switch codecFor(e.DataContentType()) {
	case codecJSON:
		if len(e.Data()) == 0 {
			return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "event has no data")
		}
		return e.Data(), nil
	case codecMsgpack:
		var v any
		if err := DataAs(e, &v); err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, actionbus.Errorf(actionbus.CodeMalformedEvent, "msgpack data has no JSON form: %w", err)
		}
		return b, nil
	}
	return nil, actionbus.Errorf(actionbus.CodeUnsupportedContent, "datacontenttype %q is not supported (JSON or msgpack)", e.DataContentType())
}

func marshalMsgpack(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetCustomStructTag("json")
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func unmarshalMsgpack(data []byte, v any) error {
	r := bytes.NewReader(data)
	dec := msgpack.NewDecoder(r)
	dec.SetCustomStructTag("json")
	if err := dec.Decode(v); err != nil {
		return err
	}
	if r.Len() != 0 {
		return actionbus.Errorf(actionbus.CodeMalformedEvent, "%d trailing bytes after the value", r.Len())
	}
	return nil
}
