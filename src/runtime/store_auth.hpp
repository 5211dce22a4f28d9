// Private: who may talk to the bootstrap store.
//
// The first frame of every connection (the hello) carries a 32-byte job token; rank 0's server compares it in
// constant time with its own and closes a connection that sends anything else first. The token is SHA-256 of a
// domain tag and the job secret, so the secret itself never crosses the wire. The secret is, in order:
//   - the Store constructor's `secret`, else LOOM_JOB_SECRET (Settings::job_secret), the same on every rank:
//     loomrun exports a fresh random one per job; a user's launcher exports its own (at least 16 characters);
//   - otherwise a random secret drawn by rank 0 and left in a token file only this user can read,
//     /tmp/loom-<uid>/store-<port>.secret (directory 0700, file 0600), which the other ranks read once they have
//     connected. It is written after the port is bound and before it listens, so a rank that connects reads the
//     file of the server it reached. Ranks on another host than rank 0 cannot read it: they need LOOM_JOB_SECRET.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::store_auth {

inline constexpr std::size_t kTokenBytes = 32;
inline constexpr std::size_t kMinSecretChars = 16;
using Token = std::array<std::uint8_t, kTokenBytes>;

Token derive_token(std::string_view secret);
// 64 hex characters from the kernel's random source (getrandom).
std::string random_secret();
// Constant-time comparison of `given` with `expected`: the time depends on neither's contents.
bool same_token(std::string_view given, const Token& expected);

// The token file of the store on `port` of this host.
std::string token_file(int port);
// Writes `secret` to the token file (atomically, mode 0600), creating the private directory. Raises when the
// directory exists but is not private to this user (another user may have created it).
void write_token_file(int port, const std::string& secret);
// The secret rank 0 left for `port`; raises naming the file and what is wrong with it.
std::string read_token_file(int port);
void remove_token_file(int port);

}  // namespace loom::store_auth
