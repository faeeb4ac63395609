package policy

import "encoding/json"

// DecodeStored decodes a policy from its stored form, the JSON AppendJSON
// writes. No write or sidecar push decodes one any more: a typed Raft
// command carries the policy, the store's policy heads serve a write's
// compare-and-set, and a change notification carries the applied policy.
// What is left (start-up, a resync, an admin list, a feed replay, a command
// from a node of command version 1) is rare enough for encoding/json.
func DecodeStored(data []byte) (*Policy, error) {
	var p Policy
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
