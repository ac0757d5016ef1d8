package kubeauth

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// maxJWT bounds the token Audiences reads: a service account token is
// about 1 KiB, and a request header far less than this.
const maxJWT = 64 << 10

// Audiences reads the aud claim of a JWT, unverified (TokenReview
// verifies the token; a changed claim breaks its signature); isJWT is
// false for a token that is not one.
func Audiences(tok string) (aud []string, isJWT bool) {
	if len(tok) > maxJWT {
		return nil, false
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, false
	}
	var payload struct {
		Aud json.RawMessage `json:"aud"`
	}
	if err := json.Unmarshal(b, &payload); err != nil {
		return nil, false
	}
	var one string
	if err := json.Unmarshal(payload.Aud, &one); err == nil {
		return []string{one}, true
	}
	var many []string
	if err := json.Unmarshal(payload.Aud, &many); err != nil {
		return nil, true
	}
	return many, true
}
