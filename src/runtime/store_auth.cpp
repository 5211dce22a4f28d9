#include "runtime/store_auth.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "jit/sha256.hpp"
#include "loom/runtime/error.hpp"

namespace loom::store_auth {
namespace {

constexpr std::string_view kDomain = "loom bootstrap store token v1";

std::string private_dir() { return fmt::format("/tmp/loom-{}", ::geteuid()); }

// Raises unless `st` describes something owned by this user that no one else may read or write.
void check_private(const struct stat& st, const std::string& path, bool want_dir) {
    const bool kind_ok = want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
    LOOM_CHECK(kind_ok && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0,
               "store token {} {} is not private to this user (expected a {} owned by uid {} with mode 0{}, found "
               "uid {}, mode 0{:o}): remove it, or set LOOM_JOB_SECRET to the same secret on every rank",
               want_dir ? "directory" : "file", path, want_dir ? "directory" : "regular file", ::geteuid(),
               want_dir ? "700" : "600", st.st_uid, st.st_mode & 07777);
}

void ensure_private_dir(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) detail::throw_errno(errno, "mkdir", __FILE__, __LINE__);
    struct stat st {};
    LOOM_CHECK_ERRNO(::lstat(dir.c_str(), &st));
    check_private(st, dir, true);
}

}  // namespace

Token derive_token(std::string_view secret) {
    jit::detail::Sha256 h;
    h.field(kDomain).field(secret);
    return h.digest();
}

std::string random_secret() {
    std::uint8_t raw[32];
    for (std::size_t got = 0; got < sizeof raw;) {
        ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR) continue;
        LOOM_CHECK_ERRNO(n);
        got += static_cast<std::size_t>(n);
    }
    std::string hex;
    for (std::uint8_t b : raw) hex += fmt::format("{:02x}", b);
    return hex;
}

bool same_token(std::string_view given, const Token& expected) {
    // The length is not secret (every token has kTokenBytes); the contents are compared without an early exit.
    if (given.size() != expected.size()) return false;
    volatile std::uint8_t diff = 0;
    for (std::size_t i = 0; i < expected.size(); ++i)
        diff = static_cast<std::uint8_t>(diff | (static_cast<std::uint8_t>(given[i]) ^ expected[i]));
    return diff == 0;
}

std::string token_file(int port) { return fmt::format("{}/store-{}.secret", private_dir(), port); }

void write_token_file(int port, const std::string& secret) {
    const std::string dir = private_dir(), path = token_file(port);
    ensure_private_dir(dir);
    const std::string tmp = fmt::format("{}/.store-{}.{}.tmp", dir, port, ::getpid());
    ::unlink(tmp.c_str());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    LOOM_CHECK(fd >= 0, "cannot create the store token file {}: {}", tmp, std::strerror(errno));
    const std::string text = secret + "\n";
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const int write_err = errno;
    ::close(fd);
    if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = written ? errno : write_err;
        ::unlink(tmp.c_str());
        LOOM_FAIL("cannot write the store token file {}: {}", path, std::strerror(err));
    }
}

std::string read_token_file(int port) {
    const std::string dir = private_dir(), path = token_file(port);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0) check_private(st, dir, true);
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    LOOM_CHECK(fd >= 0,
               "no job secret: LOOM_JOB_SECRET is unset and rank 0's token file {} cannot be read ({}). Without "
               "LOOM_JOB_SECRET every rank must run on rank 0's host as the same user; otherwise export the same "
               "LOOM_JOB_SECRET (16 or more characters, e.g. from /dev/urandom) to every rank",
               path, std::strerror(errno));
    char buf[130];
    ssize_t n = -1;
    if (::fstat(fd, &st) == 0) {
        try {
            check_private(st, path, false);
        } catch (...) {
            ::close(fd);
            throw;
        }
        n = ::read(fd, buf, sizeof buf);
    }
    ::close(fd);
    std::string text(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    LOOM_CHECK(text.size() == 64 && text.find_first_not_of("0123456789abcdef") == std::string::npos,
               "store token file {}: expected 64 hex characters, found {} bytes that are not", path, text.size());
    return text;
}

void remove_token_file(int port) { ::unlink(token_file(port).c_str()); }

}  // namespace loom::store_auth
