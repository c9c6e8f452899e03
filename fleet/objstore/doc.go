// Package objstore keeps snapshot bundles in an S3-compatible object store
// (minio-go), content-addressed, per tenant, and encrypted with the
// tenant's key when it has one.
//
// A bundle is a tar stream of regular files (hostd/daemon's sandbox
// bundles: a few small records and many chunks of at most MaxBlob bytes;
// the guest memory's chunks are the memsnap layer's own, the pieces the
// host's page store keeps, so the bucket keeps each of them once per
// tenant and key whichever snapshots, sandboxes and templates hold it).
// PutBundle stores each file as a blob and then one manifest listing them
// in order; GetBundle writes the same tar stream back from a manifest. In
// the bucket:
//
//	<tenant>/blobs/<name>       one file's bytes (sealed: hostd/crypt's format)
//	<tenant>/manifests/<name>   the manifest (JSON, sealed the same way)
//
// A reference is "s3://BUCKET/TENANT/MANIFEST-NAME" (Ref).
//
// # Names
//
// A name is HMAC-SHA256 under the tenant's name key of the mode ("plain",
// or "key:" and the tenant key's ID) and the SHA-256 of the plaintext,
// in hex. The name key is derived from Config.NameSecret and the tenant:
// the same file of two tenants has unrelated names, and nobody without
// the secret can test a guess of what a tenant stores; a tenant's new
// key gives new names, so blobs are never shared across its keys. Equal
// files of one tenant under one key share one blob: a blob that exists is
// not uploaded again.
//
// # Trust
//
// Nothing read back is trusted. Every object is read with a bound
// (MaxManifest, MaxBlob and the encryption's overhead); a sealed one is
// opened under the tenant's key (authenticated: another tenant's blob, or
// a tampered one, fails); a tenant with a key accepts only sealed
// objects; and every plaintext must hash, under the tenant's name key, to
// the name it was fetched by. A manifest must name the tenant it was read
// for, at most MaxEntries files, and valid file names.
//
// # Cache
//
// With Config.CacheDir, objects fetched are kept there as they came (still
// sealed), CACHE/<tenant>/<kind>/<name>, and read from there next time,
// checked again on every read (a cached copy that fails is removed and
// fetched anew).
//
// A Store may be used by several goroutines at once.
package objstore
