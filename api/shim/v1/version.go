package shimv1

// APIVersion is the version of this API a shim serves and a supervisor
// speaks. A supervisor adopts shims whose version it still speaks, so that a
// new release takes over the sessions of the previous one; a change that an
// older peer cannot follow bumps it.
//
// 2: StartRequest.env and secrets.
// 3: Secret.name, token_hosts and token_field; SecretUpdates.
// 4: session.json's spec.runAs (a host session's account).
// 5: Forward, Unforward and ListForwards.
// 6: StartRequest.claim.
const APIVersion = 6

// ClaimAPIVersion is the first version that takes a warm shim's claim with
// Start; an older shim reads it from session.json, which must be written
// before Start then.
const ClaimAPIVersion = 6

// ForwardAPIVersion is the first version that forwards into a session.
const ForwardAPIVersion = 5

// RunAsAPIVersion is the first version that runs a host session as the
// account spec.runAs names: an older shim would run it as itself (root).
const RunAsAPIVersion = 4

// RenewAPIVersion is the first version that renews secrets (SecretUpdates).
const RenewAPIVersion = 3

// PrivateEnvAPIVersion is the first version whose Start takes Env.
const PrivateEnvAPIVersion = 2

// MinAPIVersion is the oldest shim API this release can adopt.
const MinAPIVersion = 1
