<#
.SYNOPSIS
  Install (or remove) the xaf-hub patrol, or the overview page (-Program Serve), on Windows: a
  Task Scheduler task, or an nssm service.

.DESCRIPTION
  Task mode (default) fills the placeholders of xaf-hub-patrol.xml (xaf-hub-serve.xml for
  -Program Serve) and registers the task for
  the current user: starts at logon, restarted by a 5-minute watchdog trigger if it exits.
  Task Scheduler's "End" is a hard stop; the hub's files are written atomically, so nothing
  is left half-written, but the step in progress is cut short.

  Nssm mode installs a Windows service with nssm (https://nssm.cc). Stopping the service sends
  Ctrl+C, the patrol finishes the step it is running and exits; nssm waits up to 300 s. Output
  goes to patrol.out.log / patrol.err.log (serve.*.log for Serve) in -LogDir. Exit code 4 (bad
  config) is not retried.

  Both modes run `xaf-hub doctor` first and stop when it reports a config problem.

.EXAMPLE
  .\install.ps1 -Config C:\Users\me\.xaf_hub\config.json
.EXAMPLE
  .\install.ps1 -Config C:\Users\me\.xaf_hub\config.json -AtStartup     # elevated prompt
.EXAMPLE
  .\install.ps1 -Mode Nssm -Config C:\hub\config.json -ServiceCredential (Get-Credential)
.EXAMPLE
  .\install.ps1 -Program Serve -Config C:\Users\me\.xaf_hub\config.json   # http://127.0.0.1:7317/
.EXAMPLE
  .\install.ps1 -Uninstall            # or: .\install.ps1 -Mode Nssm -Uninstall
#>
[CmdletBinding()]
param(
    [ValidateSet('Task', 'Nssm')]
    [string]$Mode = 'Task',
    # What to run: the patrol, or serve (the live overview page, read-only, on 127.0.0.1:7317).
    [ValidateSet('Patrol', 'Serve')]
    [string]$Program = 'Patrol',
    [string]$Config,
    # Folder holding python.exe / pythonw.exe of the environment xaf-hub is installed in.
    [string]$PythonDir,
    [string]$WorkDir,
    [string]$LogDir = (Join-Path $env:USERPROFILE '.xaf_hub\logs'),
    [string]$Name,
    # Task mode: start at boot without a logon (S4U, needs an elevated prompt) instead of at logon.
    [switch]$AtStartup,
    # Nssm mode: the account the service runs as (default LocalSystem has another home folder).
    [pscredential]$ServiceCredential,
    [switch]$Uninstall
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
$program = $Program.ToLowerInvariant()
if (-not $Name) { $Name = "xaf-hub-$program" }
# The command line after `xaf_hub [--config ...]`: serve stays on loopback, on its usual port.
$arguments = if ($program -eq 'serve') { @('serve', '--port', '7317') } else { @('patrol') }

function Remove-Patrol {
    if ($Mode -eq 'Task') {
        if (Get-ScheduledTask -TaskName $Name -ErrorAction SilentlyContinue) {
            Stop-ScheduledTask -TaskName $Name -ErrorAction SilentlyContinue
            Unregister-ScheduledTask -TaskName $Name -Confirm:$false
            Write-Host "removed scheduled task '$Name'"
        } else {
            Write-Host "no scheduled task '$Name'"
        }
    } else {
        $nssm = (Get-Command nssm.exe -ErrorAction Stop).Source
        & $nssm stop $Name | Out-Null
        & $nssm remove $Name confirm
    }
}

if ($Uninstall) { Remove-Patrol; return }

if (-not $Config) { throw '-Config PATH is required (the config.json the patrol should use)' }
$Config = (Resolve-Path -LiteralPath $Config).Path
if (-not $WorkDir) { $WorkDir = Split-Path -Parent $Config }
if (-not $PythonDir) {
    $cmd = Get-Command xaf-hub.exe -ErrorAction SilentlyContinue
    if (-not $cmd) { throw 'xaf-hub.exe is not on PATH: pass -PythonDir (the venv''s Scripts folder)' }
    $PythonDir = Split-Path -Parent $cmd.Source
}
$python = Join-Path $PythonDir 'python.exe'
$pythonw = Join-Path $PythonDir 'pythonw.exe'
foreach ($exe in @($python, $pythonw)) {
    if (-not (Test-Path -LiteralPath $exe)) { throw "not found: $exe (check -PythonDir)" }
}

# Passwords belong in config.local.json beside the config: readable by this user only.
$local = Join-Path (Split-Path -Parent $Config) 'config.local.json'
if (Test-Path -LiteralPath $local) {
    & icacls.exe $local /inheritance:r /grant:r "$($env:USERNAME):(R,W)" | Out-Null
    Write-Host "restricted $local to $env:USERNAME"
}

# Refuse to install a patrol that cannot start: doctor exits 4 on a config problem.
& $python -m xaf_hub --config $Config doctor
$doctorExit = $LASTEXITCODE
if ($doctorExit -eq 4) { throw 'xaf-hub doctor found a config problem (above); fix it and run again' }
if ($doctorExit -ne 0) { Write-Warning "xaf-hub doctor exited $doctorExit; installing anyway" }

if ($Mode -eq 'Task') {
    $user = [System.Security.Principal.WindowsIdentity]::GetCurrent().Name
    $xml = Get-Content -Raw -LiteralPath (Join-Path $PSScriptRoot "xaf-hub-$program.xml")
    $values = @{
        '@@XAF_HUB_PYTHONW@@' = $pythonw
        '@@XAF_HUB_CONFIG@@'  = $Config
        '@@XAF_HUB_WORKDIR@@' = $WorkDir
        '@@XAF_HUB_USER@@'    = $user
    }
    foreach ($key in $values.Keys) {
        $xml = $xml.Replace($key, [System.Security.SecurityElement]::Escape($values[$key]))
    }
    if ($xml -match '@@[A-Z_]+@@') { throw "unfilled placeholder $($Matches[0]) in the task XML" }
    if ($AtStartup) {
        # At boot there is no interactive session: run as S4U (no stored password).
        $xml = $xml -replace '(?s)<LogonTrigger>.*?</LogonTrigger>',
            '<BootTrigger><Enabled>true</Enabled><Delay>PT1M</Delay></BootTrigger>'
        $xml = $xml.Replace('<LogonType>InteractiveToken</LogonType>', '<LogonType>S4U</LogonType>')
    }
    # The API gets the text as a UTF-16 string; a UTF-8 declaration would contradict it.
    $xml = $xml -replace '^\s*<\?xml[^>]*\?>\s*', ''
    Register-ScheduledTask -TaskName $Name -Xml $xml -Force | Out-Null
    Start-ScheduledTask -TaskName $Name
    Write-Host "registered and started scheduled task '$Name' (runs as $user)"
    $pause = if ($program -eq 'patrol') { 'xaf-hub patrol pause; ' } else { '' }
    Write-Host "stop: ${pause}Disable-ScheduledTask '$Name'; Stop-ScheduledTask '$Name'"
} else {
    $nssm = (Get-Command nssm.exe -ErrorAction Stop).Source
    New-Item -ItemType Directory -Force -Path $LogDir | Out-Null
    # The config travels as XAF_HUB_CONFIG, not --config: nssm stores parameters as one string
    # and a path with spaces would need quotes that Windows PowerShell 5.1 passes on mangled.
    & $nssm install $Name $python -m xaf_hub @arguments
    $settings = @(
        @('AppDirectory', $WorkDir),
        @('AppStdout', (Join-Path $LogDir "$program.out.log")),
        @('AppStderr', (Join-Path $LogDir "$program.err.log")),
        @('AppRotateFiles', '1'),
        @('AppRotateBytes', '10485760'),
        # Ctrl+C first and wait 300 s: the patrol finishes its step, then exits.
        @('AppStopMethodConsole', '300000'),
        @('AppRestartDelay', '30000'),
        @('AppEnvironmentExtra', 'PYTHONUNBUFFERED=1', "XAF_HUB_CALLER=$program-service",
          "XAF_HUB_CONFIG=$Config"),
        @('Start', 'SERVICE_AUTO_START')
    )
    foreach ($s in $settings) { & $nssm set $Name @s | Out-Null }
    & $nssm set $Name AppExit Default Restart | Out-Null
    & $nssm set $Name AppExit 0 Exit | Out-Null
    & $nssm set $Name AppExit 4 Exit | Out-Null   # bad config: restarting cannot fix it
    if ($ServiceCredential) {
        $plain = $ServiceCredential.GetNetworkCredential().Password
        & $nssm set $Name ObjectName $ServiceCredential.UserName $plain | Out-Null
    } else {
        Write-Warning 'service runs as LocalSystem: its hub home is not yours; pass -ServiceCredential'
    }
    & $nssm start $Name
    Write-Host "installed service '$Name'; logs in $LogDir"
    $pause = if ($program -eq 'patrol') { 'xaf-hub patrol pause; ' } else { '' }
    Write-Host "stop gracefully: ${pause}nssm stop $Name"
}
