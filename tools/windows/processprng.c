/* bcryptprimitives.dll with the one export Wine 8.0 lacks: ProcessPrng.
 *
 * Rust's standard library (from 1.78) asks Windows for random bytes through
 * bcryptprimitives.dll!ProcessPrng; Wine 8.0 ships no such DLL, so every Rust-built wheel
 * (pydantic-core, which typer pulls in) fails to load. This DLL answers the call with
 * advapi32's RtlGenRandom (exported as SystemFunction036). tools/windows-tests builds it with
 * mingw and copies it into the Wine prefix's system32; it is never part of vcam.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
