package auth

import (
	"errors"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzVerify feeds arbitrary strings to an HMAC and an RSA verifier: neither
// may panic, every failure must wrap ErrBadCredentials, and anything accepted
// must carry the required claims. Run longer with:
//
//	go test ./internal/auth/ -run '^$' -fuzz '^FuzzVerify$' -fuzztime 60s
func FuzzVerify(f *testing.F) {
	keys := testKeys()
	clock := newFakeClock()

	hmacCfg := baseConfig()
	hmacCfg.HMACSecretFile = writeFile(f, "secret", keys.secret)
	hmacV := newTestVerifier(f, hmacCfg, clock, nil)

	rsaCfg := baseConfig()
	rsaCfg.PublicKeysFile = writeFile(f, "keys.pem", pemPKIX(f, &keys.rsaA.PublicKey))
	rsaCfg.JWKSFile = writeFile(f, "jwks.json", jwksJSON(f, testJWK{kid: "a", pub: &keys.rsaA.PublicKey}))
	rsaV := newTestVerifier(f, rsaCfg, clock, nil)

	valid := claimsAt(clock.Now())
	hs := sign(f, jwt.SigningMethodHS256, keys.secret, valid, nil)
	rs := sign(f, jwt.SigningMethodRS256, keys.rsaA, valid, kid("a"))
	f.Add(hs)
	f.Add(rs)
	f.Add(sign(f, jwt.SigningMethodHS256, keys.secret, with(valid, "org", nil), nil))
	f.Add(sign(f, jwt.SigningMethodHS256, keys.secret, with(valid, "sub", 1), nil))
	f.Add(sign(f, jwt.SigningMethodHS256, pemPKIX(f, &keys.rsaA.PublicKey), valid, nil))
	f.Add(sign(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid, nil))
	f.Add(tamper(f, rs))
	f.Add(hs[:len(hs)/2])
	f.Add(strings.Repeat("a.", 100))
	f.Add("eyJhbGciOiJIUzI1NiJ9.e30.")
	f.Add("eyJhbGciOiJSUzI1NiIsImtpZCI6e319.e30.AA")
	f.Add("..")
	f.Add("")
	f.Add("\x00\xff.\xfe.")
	f.Fuzz(func(t *testing.T, token string) {
		for name, v := range map[string]*JWTVerifier{"hmac": hmacV, "rsa": rsaV} {
			c, err := v.Verify(token)
			if err != nil {
				if !errors.Is(err, ErrBadCredentials) {
					t.Fatalf("%s: error %v does not wrap ErrBadCredentials", name, err)
				}
				continue
			}
			if c.Subject == "" || c.Org == "" || c.Expiry.IsZero() {
				t.Fatalf("%s: accepted a token without required claims: %+v", name, c)
			}
		}
	})
}
