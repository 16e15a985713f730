/*
 * TCP listeners are TLS only: the daemon refuses a TCP address without a
 * certificate, serves gRPC over TLS with one, and a client that trusts the
 * certificate ($GRAPHD_TLS_CA) gets a working session while one that does not
 * is refused. The certificate is made at test time with the openssl CLI.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

typedef struct {
    char dir[64];
    char cert[128], key[128], log[128], session[128];
    char address[64];
    pid_t pid;
} tls_env_t;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* Starts graphd with argv (NULL-terminated, without the program); stderr to log. */
static pid_t spawn(const char *log, const char *const *args)
{
    char exe[256];
    snprintf(exe, sizeof exe, "%s/graphd", harness_build_dir());
    const char *argv[32] = {exe};
    size_t n = 1;
    for (size_t i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0)
            dup2(fd, STDERR_FILENO);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int setup(void **state)
{
    static tls_env_t e;
    memset(&e, 0, sizeof e);
    snprintf(e.dir, sizeof e.dir, "/tmp/graphd-tls-XXXXXX");
    if (mkdtemp(e.dir) == NULL)
        return -1;
    snprintf(e.cert, sizeof e.cert, "%s/cert.pem", e.dir);
    snprintf(e.key, sizeof e.key, "%s/key.pem", e.dir);
    snprintf(e.log, sizeof e.log, "%s/graphd.log", e.dir);
    snprintf(e.session, sizeof e.session, "%s/graphd.session", e.dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout %s -out %s "
             ">/dev/null 2>&1",
             e.key, e.cert);
    if (system(cmd) != 0)
        return -1;
    int port = free_port();
    if (port < 0)
        return -1;
    snprintf(e.address, sizeof e.address, "127.0.0.1:%d", port);
    const char *args[] = {"--config",    "/dev/null", "--listen", e.address,          "--tls-cert",
                          e.cert,        "--tls-key", e.key,      "--session-socket", e.session,
                          "--log-level", "debug",     NULL};
    e.pid = spawn(e.log, args);
    setenv("GRAPHD_TLS_CA", e.cert, 1);
    for (int i = 0; i < 200; i++) {
        graphd_client_t *c;
        size_t n = 0;
        if (graphd_connect(e.address, &c) == GRAPHD_OK) {
            int rc = graphd_list_devices(c, &n, NULL);
            graphd_close(c);
            if (rc == GRAPHD_OK) {
                *state = &e;
                return 0;
            }
        }
        usleep(50000);
    }
    return -1;
}

static int teardown(void **state)
{
    tls_env_t *e = *state;
    int status = 0;
    kill(e->pid, SIGTERM);
    waitpid(e->pid, &status, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    if (system(cmd) != 0)
        return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static void trusted_client_gets_a_session(void **state)
{
    tls_env_t *e = *state;
    setenv("GRAPHD_TLS_CA", e->cert, 1);
    graphd_client_t *c;
    assert_int_equal(graphd_connect(e->address, &c), GRAPHD_OK);
    assert_int_equal(graphd_hello(c, "over-tls"), GRAPHD_OK);
    graphd_device_t devs[8];
    size_t n = 8;
    assert_int_equal(graphd_list_devices(c, &n, devs), GRAPHD_OK);
    assert_true(n >= 1);
    assert_string_equal(devs[0].id, "cpu:0");
    /* The data plane stays a local Unix socket; regions work as over a Unix listener. */
    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(c, NULL, 8192, &r), GRAPHD_OK);
    memset(graphd_region_ptr(r), 7, 8192);
    assert_int_equal(graphd_region_free(c, r), GRAPHD_OK);
    graphd_close(c);
}

static void untrusted_client_is_refused(void **state)
{
    tls_env_t *e = *state;
    unsetenv("GRAPHD_TLS_CA"); /* gRPC's default roots do not hold the test certificate */
    graphd_client_t *c;
    assert_int_equal(graphd_connect(e->address, &c), GRAPHD_OK);
    size_t n = 0;
    assert_int_equal(graphd_list_devices(c, &n, NULL), GRAPHD_EUNAVAILABLE);
    graphd_close(c);
    setenv("GRAPHD_TLS_CA", "/nonexistent/ca.pem", 1);
    assert_int_equal(graphd_connect(e->address, &c), GRAPHD_ESYS);
    setenv("GRAPHD_TLS_CA", e->cert, 1);
}

static void tcp_without_tls_is_refused(void **state)
{
    tls_env_t *e = *state;
    char log[160], addr[64];
    snprintf(log, sizeof log, "%s/plain.log", e->dir);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    const char *args[] = {"--config", "/dev/null", "--listen", addr, NULL};
    int status = 0;
    waitpid(spawn(log, args), &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 2);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char text[1024] = "";
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    assert_non_null(strstr(text, "tls_cert"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trusted_client_gets_a_session),
        cmocka_unit_test(untrusted_client_is_refused),
        cmocka_unit_test(tcp_without_tls_is_refused),
    };
    return cmocka_run_group_tests_name("tls", tests, setup, teardown);
}
