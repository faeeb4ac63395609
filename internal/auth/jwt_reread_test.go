package auth

import (
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// TestReloadHMAC rotates the HS256 secret: only Reload (SIGHUP) reads it
// again, a bad version keeps the previous secret, and a good one replaces
// it.
func TestReloadHMAC(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	logger, logs := newTestLogger()
	cfg := baseConfig()
	cfg.HMACSecretFile = writeFile(t, "secret", append(append([]byte{}, keys.secret...), '\n'))
	v := newTestVerifier(t, cfg, clock, logger)
	oldTok := sign(t, jwt.SigningMethodHS256, keys.secret, claimsAt(clock.Now()), nil)
	newTok := sign(t, jwt.SigningMethodHS256, keys.other, claimsAt(clock.Now()), nil)

	rewrite(t, cfg.HMACSecretFile, keys.other)
	clock.Advance(10 * keyRereadInterval)
	if _, err := v.Verify(oldTok); err != nil {
		t.Fatalf("before Reload, the secret in use changed by itself: %v", err)
	}
	if err := v.Reread(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if _, err := v.Verify(newTok); err != nil {
		t.Fatalf("token signed with the new secret after Reload: %v", err)
	}
	if _, err := v.Verify(oldTok); err == nil {
		t.Fatal("token signed with the replaced secret still verifies after Reload")
	}

	rewrite(t, cfg.HMACSecretFile, []byte("tiny-secret-xyz"))
	if err := v.Reread(); err == nil || !strings.Contains(err.Error(), "shorter than") {
		t.Fatalf("Reload of a too-short secret = %v, want an error", err)
	}
	if _, err := v.Verify(newTok); err != nil {
		t.Fatalf("a failed Reload dropped the secret in use: %v", err)
	}
	if strings.Contains(logs.String(), "tiny-secret-xyz") {
		t.Fatalf("the log quotes the secret file's content:\n%s", logs)
	}
}

// TestReloadKeyFiles shows Reload re-reads public keys at once, and reports
// a file that does not parse, also when asked again with the file unchanged.
func TestReloadKeyFiles(t *testing.T) {
	keys := testKeys()
	clock := newFakeClock()
	logger, _ := newTestLogger()
	cfg := baseConfig()
	cfg.PublicKeysFile = writeFile(t, "keys.pem", pemPKIX(t, &keys.ecA.PublicKey))
	v := newTestVerifier(t, cfg, clock, logger)
	tokenA := sign(t, jwt.SigningMethodES256, keys.ecA, claimsAt(clock.Now()), nil)
	tokenB := sign(t, jwt.SigningMethodES256, keys.ecB, claimsAt(clock.Now()), nil)

	rewrite(t, cfg.PublicKeysFile, pemPKIX(t, &keys.ecB.PublicKey))
	// No clock advance: Reload does not wait for the check interval.
	if err := v.Reread(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if _, err := v.Verify(tokenB); err != nil {
		t.Fatalf("new key after Reload: %v", err)
	}
	if _, err := v.Verify(tokenA); err == nil {
		t.Fatal("removed key still verifies after Reload")
	}

	rewrite(t, cfg.PublicKeysFile, []byte("garbage"))
	for i := range 2 {
		if err := v.Reread(); err == nil {
			t.Fatalf("Reload #%d of an unparsable key file succeeded", i+1)
		}
	}
	if _, err := v.Verify(tokenB); err != nil {
		t.Fatalf("a failed Reload dropped the keys in use: %v", err)
	}
}
