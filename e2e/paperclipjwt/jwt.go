// Package paperclipjwt mints Paperclip agent tokens the way Paperclip's
// server does (its agent-auth-jwt module), so the suite can try, from
// whatever an agent can read, to become another agent: a token signed
// with the instance's PAPERCLIP_AGENT_JWT_SECRET is accepted for any
// agent of any company, which is why that secret must never reach a run.
package paperclipjwt

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Claims names the agent a token speaks for.
type Claims struct {
	Agent, Company, AdapterType string
	// Run is the run the token is for: any UUID, the server looks for no
	// matching run (NewRunID).
	Run string
	// Instance is the server's instance id ("default" unless
	// PAPERCLIP_INSTANCE_ID says otherwise): part of the signing key.
	Instance string
}

// Mint signs c with secret as the server signs run tokens: with a key
// derived from the secret, the instance and the company. Legacy signs
// with the secret itself, which the server still accepts unless
// PAPERCLIP_AGENT_JWT_DISABLE_LEGACY_FALLBACK is set.
func Mint(secret string, c Claims, legacy bool, now time.Time) string {
	header := `{"alg":"HS256","typ":"JWT"}`
	claims, _ := json.Marshal(map[string]any{
		"sub":                 c.Agent,
		"company_id":          c.Company,
		"adapter_type":        c.AdapterType,
		"run_id":              c.Run,
		"responsible_user_id": nil,
		"iat":                 now.Unix(),
		"exp":                 now.Add(time.Hour).Unix(),
		"iss":                 "paperclip",
		"aud":                 "paperclip-api",
		"instance_id":         c.Instance,
	})
	input := b64(header) + "." + b64(string(claims))
	key := secret
	if !legacy {
		key = hex.EncodeToString(sum(secret, "jwt:"+c.Instance+":"+c.Company))
	}
	return input + "." + base64.RawURLEncoding.EncodeToString(sum(key, input))
}

func sum(key, data string) []byte {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(data))
	return m.Sum(nil)
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// NewRunID is a random run id in the server's format (a UUID).
func NewRunID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
