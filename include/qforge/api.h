/* qforge/api.h: QF_API marks the functions libqforge.so exports. The library is built with
 * -fvisibility=hidden, so a function is part of the shared library's interface exactly when its
 * declaration in include/qforge/ carries QF_API (tests/cli_layers.sh checks `nm -D` against
 * these headers). Static builds (libqforge.a) see every symbol, internal ones included. */
#ifndef QFORGE_API_H
#define QFORGE_API_H

#if defined(__GNUC__) || defined(__clang__)
#define QF_API __attribute__((visibility("default")))
#else
#define QF_API
#endif

#endif
