package client

// RemotePathScript is exported for the tests.
const RemotePathScript = remotePathScript
