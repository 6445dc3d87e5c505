module github.com/kerneldeck/kerneldeck

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	go.uber.org/goleak v1.3.0
)

require github.com/kevinburke/ssh_config v1.6.0

require (
	golang.org/x/crypto v0.59.0
	golang.org/x/sys v0.50.0 // indirect
)
