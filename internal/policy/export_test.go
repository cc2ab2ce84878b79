package policy_test

import (
	"encoding/json"

	"github.com/gowebpki/jcs"
)

func canonicalForDoc(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	c, err := jcs.Transform(b)
	return string(c), err
}
